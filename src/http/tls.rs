//! mTLS for the HTTP service (`ock.mmc.metrics.tls.*`): rustls on the monoio runtime, client
//! certificates required and verified against the configured CA (and CRLs). Files are loaded
//! once at start; anything missing or malformed stops the start with one line naming the key.
//! `client_config` is the other direction: the cluster client's TLS towards `https://` peers.

use std::sync::Arc;

use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};

use crate::config::{ClusterTls, TlsConfig};

fn certs(key: &str, path: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("cannot load {key} {path:?}: {e}"))?;
    if certs.is_empty() {
        return Err(format!(
            "cannot load {key} {path:?}: no PEM certificate in it"
        ));
    }
    Ok(certs)
}

/// The CA certificates in `path` (configuration key `key`) as a root store.
fn roots(key: &str, path: &str) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for ca in certs(key, path)? {
        roots
            .add(ca)
            .map_err(|e| format!("invalid CA certificate in {key} {path:?}: {e}"))?;
    }
    Ok(roots)
}

/// The private key in `path` (configuration key `key`).
fn private_key(key: &str, path: &str) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| format!("cannot load {key} {path:?}: {e}"))
}

/// The rustls server configuration, or the one-line reason it cannot be built.
pub fn server_config(cfg: &TlsConfig) -> Result<Arc<rustls::ServerConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let roots = roots("ock.mmc.metrics.tls.ca.path", &cfg.ca_path)?;
    let mut verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
    if !cfg.crl_path.is_empty() {
        let crls = CertificateRevocationListDer::pem_file_iter(&cfg.crl_path)
            .and_then(|it| it.collect::<Result<Vec<_>, _>>())
            .map_err(|e| {
                format!(
                    "cannot load ock.mmc.metrics.tls.crl.path {:?}: {e}",
                    cfg.crl_path
                )
            })?;
        if crls.is_empty() {
            return Err(format!(
                "cannot load ock.mmc.metrics.tls.crl.path {:?}: no PEM CRL in it",
                cfg.crl_path
            ));
        }
        verifier = verifier.with_crls(crls);
    }
    let verifier = verifier
        .build()
        .map_err(|e| format!("invalid mTLS client verification settings: {e}"))?;
    let chain = certs("ock.mmc.metrics.tls.cert.path", &cfg.cert_path)?;
    let key = private_key("ock.mmc.metrics.tls.key.path", &cfg.key_path)?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| {
            format!(
                "ock.mmc.metrics.tls.cert.path {:?} and ock.mmc.metrics.tls.key.path {:?} do not form a usable pair: {e}",
                cfg.cert_path, cfg.key_path
            )
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The rustls client configuration of the cluster's own calls to `https://` peers
/// (`ock.mmc.cluster.tls.*`, [`crate::config::Config::cluster_tls`]): their server
/// certificate must chain to the CA and name the host in the URL; the client certificate, when
/// set, is presented to peers that ask for one (a peer listening with TLS always does).
pub fn client_config(cfg: &ClusterTls) -> Result<Arc<rustls::ClientConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let roots = roots("ock.mmc.cluster.tls.ca.path", &cfg.ca_path)?;
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots);
    let mut config = if cfg.cert_path.is_empty() {
        builder.with_no_client_auth()
    } else {
        let chain = certs("ock.mmc.cluster.tls.cert.path", &cfg.cert_path)?;
        let key = private_key("ock.mmc.cluster.tls.key.path", &cfg.key_path)?;
        builder.with_client_auth_cert(chain, key).map_err(|e| {
            format!(
                "ock.mmc.cluster.tls.cert.path {:?} and ock.mmc.cluster.tls.key.path {:?} do not form a usable pair: {e}",
                cfg.cert_path, cfg.key_path
            )
        })?
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
