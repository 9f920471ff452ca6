//! The identities a test control plane knows, authenticated by static bearer tokens.

/// Who a client acts as. Each has a kubeconfig written by the harness.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Identity {
    /// Cluster admin (`system:masters`).
    Admin,
    /// The operator's service account; what it may do comes from RBAC in `config/`.
    Operator,
    /// The node agents' service account.
    NodeAgent,
    /// A developer of tenant `team-a` (group `team-a`).
    TenantA,
    /// A developer of tenant `team-b` (group `team-b`).
    TenantB,
    /// kube-scheduler, with its bootstrap RBAC role.
    Scheduler,
    /// kube-controller-manager and kwok (they need broad rights: `system:masters`).
    System,
}

impl Identity {
    pub const ALL: [Identity; 7] = [
        Identity::Admin,
        Identity::Operator,
        Identity::NodeAgent,
        Identity::TenantA,
        Identity::TenantB,
        Identity::Scheduler,
        Identity::System,
    ];

    /// Short name used for files (`<name>.kubeconfig`).
    pub fn file_name(self) -> &'static str {
        match self {
            Identity::Admin => "admin",
            Identity::Operator => "operator",
            Identity::NodeAgent => "node-agent",
            Identity::TenantA => "team-a",
            Identity::TenantB => "team-b",
            Identity::Scheduler => "scheduler",
            Identity::System => "system",
        }
    }

    /// The user name the API server sees. Service-account names make RBAC bindings to
    /// `ServiceAccount` subjects apply to the static-token identities too.
    pub fn user(self) -> &'static str {
        match self {
            Identity::Admin => "tessera-admin",
            Identity::Operator => "system:serviceaccount:tessera-system:tessera-operator",
            Identity::NodeAgent => "system:serviceaccount:tessera-system:tessera-node-agent",
            Identity::TenantA => "alice@team-a",
            Identity::TenantB => "bob@team-b",
            Identity::Scheduler => "system:kube-scheduler",
            Identity::System => "tessera-e2e-system",
        }
    }

    pub fn groups(self) -> &'static [&'static str] {
        match self {
            Identity::Admin | Identity::System => &["system:masters"],
            Identity::Operator | Identity::NodeAgent => {
                &["system:serviceaccounts", "system:serviceaccounts:tessera-system"]
            }
            Identity::TenantA => &["team-a"],
            Identity::TenantB => &["team-b"],
            Identity::Scheduler => &[],
        }
    }
}
