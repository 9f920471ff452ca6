//! The Node fence (`tessera-node-agent-node-fence` in `config/rbac/node-agent-fence.yaml`),
//! evaluated with a CEL interpreter on the writes an agent may and may not make: only its own
//! Node, and there only the `nvidia.com/gpu.deploy.*` labels; and the pod fence's DRA kubelet
//! plugin rule. The real API server runs it in
//! `e2e/tests/admission.rs`.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Value, json};

fn policy(name: &str) -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../config/rbac/node-agent-fence.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    docs.into_iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicy" && d["metadata"]["name"] == name)
        .expect("the fence")
}

fn to_cel(v: &Value) -> cel::Value {
    match v {
        Value::Number(n) => cel::Value::Int(n.as_i64().unwrap()),
        Value::Object(o) => cel::Value::from(o.iter().map(|(k, v)| (k.clone(), to_cel(v))).collect::<HashMap<_, _>>()),
        Value::Array(a) => cel::Value::List(Arc::new(a.iter().map(to_cel).collect())),
        other => cel::to_value(other).unwrap(),
    }
}

/// Runs the fence on an update of Node `name` from `old` to `new` by an agent whose token names
/// `token_node`: `Err` carries the refusals' messages.
fn admit(token_node: Option<&str>, name: &str, old: &Value, new: &Value) -> Result<(), Vec<String>> {
    admit_with("tessera-node-agent-node-fence", token_node, name, old, new)
}

/// [`admit`] by the fence `policy`.
fn admit_with(policy: &str, token_node: Option<&str>, name: &str, old: &Value, new: &Value) -> Result<(), Vec<String>> {
    let policy = self::policy(policy);
    let env = Arc::new(cel::Env::stdlib());
    let extra = token_node.map_or(json!({}), |n| json!({"authentication.kubernetes.io/node-name": [n]}));
    let request = json!({"name": name, "userInfo": {"username": "system:serviceaccount:tessera-system:tessera-node-agent", "extra": extra}});
    let run = |expr: &str, variables: &Value| {
        let program = env.compile(expr).unwrap_or_else(|e| panic!("{e}: {expr}"));
        let mut ctx = cel::Context::with_env(env.clone());
        ctx.add_variable_from_value("request", to_cel(&request));
        ctx.add_variable_from_value("oldObject", to_cel(old));
        ctx.add_variable_from_value("object", to_cel(new));
        ctx.add_variable_from_value("variables", to_cel(variables));
        program.execute(&ctx).unwrap_or_else(|e| panic!("{e:?}: {expr}"))
    };
    let spec = &policy["spec"];
    for c in spec["matchConditions"].as_array().unwrap() {
        assert_eq!(run(c["expression"].as_str().unwrap(), &json!({})), cel::Value::Bool(true), "matches the agent");
    }
    let mut variables = serde_json::Map::new();
    for v in spec["variables"].as_array().unwrap() {
        let value = match run(v["expression"].as_str().unwrap(), &Value::Object(variables.clone())) {
            cel::Value::String(s) => json!(s.as_str()),
            other => panic!("variables here are strings: {other:?}"),
        };
        variables.insert(v["name"].as_str().unwrap().into(), value);
    }
    let variables = Value::Object(variables);
    let mut refused = Vec::new();
    for rule in spec["validations"].as_array().unwrap() {
        match run(rule["expression"].as_str().unwrap(), &variables) {
            cel::Value::Bool(true) => {}
            cel::Value::Bool(false) => match run(rule["messageExpression"].as_str().unwrap(), &variables) {
                cel::Value::String(s) => refused.push(s.to_string()),
                other => panic!("a message is a string: {other:?}"),
            },
            other => panic!("a rule is a bool: {other:?}"),
        }
    }
    if refused.is_empty() { Ok(()) } else { Err(refused) }
}

fn node(labels: Value) -> Value {
    json!({"metadata": {"name": "gpu-a", "labels": labels, "annotations": {"a": "1"}},
           "spec": {"unschedulable": true, "taints": [{"key": "k", "effect": "NoSchedule"}]}})
}

#[test]
fn an_agent_may_change_only_the_deploy_labels_of_its_own_node() {
    let old = node(json!({"kubernetes.io/hostname": "gpu-a", "nvidia.com/gpu.deploy.device-plugin": "true"}));
    let paused = node(json!({"kubernetes.io/hostname": "gpu-a",
        "nvidia.com/gpu.deploy.device-plugin": "paused-for-mig-change", "nvidia.com/gpu.deploy.dcgm": "true"}));
    assert_eq!(admit(Some("gpu-a"), "gpu-a", &old, &paused), Ok(()));
    assert_eq!(admit(Some("gpu-a"), "gpu-a", &paused, &old), Ok(()), "removing a deploy label");
    let no_labels = json!({"metadata": {"name": "gpu-a"}, "spec": {}});
    assert_eq!(admit(Some("gpu-a"), "gpu-a", &no_labels, &no_labels), Ok(()));

    let e = admit(Some("gpu-a"), "gpu-b", &old, &paused).unwrap_err();
    assert_eq!(e, vec!["a node agent may change only its own Node: token of node gpu-a, Node gpu-b"]);
    let e = admit(None, "gpu-a", &old, &paused).unwrap_err();
    assert_eq!(e, vec!["a node agent may change only its own Node: token of node (none), Node gpu-a"]);

    let label_refused = "a node agent may change only the nvidia.com/gpu.deploy.* labels of its Node: Node gpu-a, \
                         another label changed";
    let other_refused = "a node agent may change only the nvidia.com/gpu.deploy.* labels of its Node: Node gpu-a, \
                         its annotations, owners, finalizers or spec changed";
    let mut changed_label = old.clone();
    changed_label["metadata"]["labels"]["kubernetes.io/hostname"] = json!("x");
    let mut added_label = old.clone();
    added_label["metadata"]["labels"]["nvidia.com/gpu.deploy"] = json!("x");
    let mut removed_label = old.clone();
    removed_label["metadata"]["labels"].as_object_mut().unwrap().remove("kubernetes.io/hostname");
    for new in [changed_label, added_label, removed_label] {
        assert_eq!(admit(Some("gpu-a"), "gpu-a", &old, &new), Err(vec![label_refused.to_string()]), "{new}");
    }
    assert_eq!(
        admit(Some("gpu-a"), "gpu-a", &no_labels, &node(json!({"x": "y"}))),
        Err(vec![label_refused.to_string(), other_refused.to_string()])
    );
    let mut uncordoned = old.clone();
    uncordoned["spec"]["unschedulable"] = json!(false);
    let mut untainted = old.clone();
    untainted["spec"].as_object_mut().unwrap().remove("taints");
    let mut annotated = old.clone();
    annotated["metadata"]["annotations"]["a"] = json!("2");
    let mut unannotated = old.clone();
    unannotated["metadata"].as_object_mut().unwrap().remove("annotations");
    let mut finalized = old.clone();
    finalized["metadata"]["finalizers"] = json!(["x"]);
    for new in [uncordoned, untainted, annotated, unannotated, finalized] {
        assert_eq!(admit(Some("gpu-a"), "gpu-a", &old, &new), Err(vec![other_refused.to_string()]), "{new}");
    }
}

fn pod(node: &str, labels: Value) -> Value {
    json!({"metadata": {"name": "p", "namespace": "gpu", "labels": labels}, "spec": {"nodeName": node}})
}

/// The pod fence lets an agent restart NVIDIA's DRA kubelet plugin on its node (the default
/// `--dra-plugin-selector`) as it does the GPU clients, and nothing else.
#[test]
fn an_agent_may_delete_the_dra_kubelet_plugin_pods_of_its_own_node_only() {
    let fence = "tessera-node-agent-pod-fence";
    let delete = |p: &Value| admit_with(fence, Some("gpu-a"), "p", p, &Value::Null);
    let plugin = json!({"nvidia-dra-driver-gpu-component": "kubelet-plugin"});
    assert_eq!(delete(&pod("gpu-a", plugin.clone())), Ok(()));
    assert_eq!(delete(&pod("gpu-a", json!({"app": "nvidia-device-plugin-daemonset"}))), Ok(()));
    for refused in [
        pod("gpu-b", plugin),
        pod("gpu-a", json!({"nvidia-dra-driver-gpu-component": "controller"})),
        pod("gpu-a", json!({"app": "web"})),
        pod("gpu-a", json!({})),
    ] {
        let e = delete(&refused).unwrap_err();
        assert!(e.iter().all(|m| m.contains("gpu/p")), "{e:?}");
    }
    let e = delete(&pod("gpu-a", json!({"app": "web"}))).unwrap_err();
    assert!(e[0].contains("DRA kubelet plugin (label") && e[0].ends_with("pod gpu/p is not a GPU client"), "{e:?}");
}
