//! Throwaway PKI for one control plane: a CA, the API server's serving certificate for 127.0.0.1,
//! and the service-account signing key. Generated in-process (rcgen), so no openssl is needed.

use std::path::Path;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose, SanType};

use crate::Error;

/// Writes `ca.crt`, `apiserver.crt`, `apiserver.key`, `sa.key` and `sa.pub` into `dir`.
pub fn write_pki(dir: &Path) -> Result<(), Error> {
    let pki = |e: rcgen::Error| Error::Pki(e.to_string());
    let ca_key = KeyPair::generate().map_err(pki)?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(pki)?;
    ca.distinguished_name.push(DnType::CommonName, "tessera-e2e-ca");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let ca_cert = ca.self_signed(&ca_key).map_err(pki)?;
    let issuer = rcgen::Issuer::from_params(&ca, &ca_key);

    let server_key = KeyPair::generate().map_err(pki)?;
    let mut server = CertificateParams::new(vec!["localhost".to_string()]).map_err(pki)?;
    server.subject_alt_names.push(SanType::IpAddress("127.0.0.1".parse().expect("valid IP")));
    server.subject_alt_names.push(SanType::IpAddress("10.96.0.1".parse().expect("valid IP")));
    server.distinguished_name.push(DnType::CommonName, "kube-apiserver");
    let server_cert = server.signed_by(&server_key, &issuer).map_err(pki)?;

    let sa_key = KeyPair::generate().map_err(pki)?;
    let write = |name: &str, body: String| std::fs::write(dir.join(name), body).map_err(|e| Error::io(name, e));
    write("ca.crt", ca_cert.pem())?;
    write("apiserver.crt", server_cert.pem())?;
    write("apiserver.key", server_key.serialize_pem())?;
    write("sa.key", sa_key.serialize_pem())?;
    write("sa.pub", sa_key.public_key_pem())?;
    Ok(())
}
