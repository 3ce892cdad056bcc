// Package certificates holds nothing itself: its packages are the serving
// certificates of hookwright's webhook servers and the operator's own
// validating webhook, one concern each.
//
//   - pki: keys, certificates, caBundles and the CA rotation plan, pure.
//   - sources: one Source per spec.certificate.mode (SelfSigned, Secret,
//     CertManager, CSR), the installation CA controller and the caBundle
//     of every webhook configuration; the only one here that talks to the
//     API server.
//   - csrplan: mode CSR's plan, pure; its I/O is sources/csr.go.
//   - csrsign: the operator's CSR signer's policy and signing, pure; its
//     controllers are controllers/csrsigner.
//   - cadir: the watcher of the operator's --ca-dir.
//
// Only sources may use a Kubernetes client; none imports controllers/ or
// cmd/ (internal/importrules checks each). It imports nothing.
package certificates
