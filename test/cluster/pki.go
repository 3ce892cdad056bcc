package cluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// The harness makes the API server's certificates itself instead of letting
// envtest do it: envtest's serving certificate names only localhost and
// 127.0.0.1, but a pod on a real node dials the kubernetes Service
// (rest.InClusterConfig: https://$KUBERNETES_SERVICE_HOST:443) and verifies
// its IP and the kubernetes.default.svc names, as kubeadm's certificate
// carries them (cmd/kubeadm/app/phases/certs: GetAPIServerAltNames).
//
// envtest keeps files it finds in its CertDir (populateAPIServerCerts stops
// when apiserver.crt exists), so writing them there first is enough; the
// file names are envtest's.
const (
	pkiCA            = "ca.crt"
	pkiServingCert   = "apiserver.crt"
	pkiServingKey    = "apiserver.key"
	pkiSAPublic      = "sa-signer.crt"
	pkiSAKey         = "sa-signer.key"
	pkiKubeletClient = "kubelet-client.crt"
	pkiKubeletKey    = "kubelet-client.key"
	// pkiValidity outlasts a `make demo` left running for days.
	pkiValidity = 365 * 24 * time.Hour
	// KubeletClientUser is the API server's identity towards kubelets
	// (logs, exec, port-forward), in system:masters as kubeadm's
	// apiserver-kubelet-client was before v1.29.
	KubeletClientUser = "kube-apiserver-kubelet-client"
)

// writeClusterPKI writes into dir a CA, the API server's serving
// certificate for localhost, 127.0.0.1 and the kubernetes Service
// (serviceIP and its DNS names), a P-256 service-account signing key, and
// the API server's client certificate for kubelets. The CA also signs
// real nodes' kubelet serving certificates and is the kubelets' client CA.
func writeClusterPKI(dir string, serviceIP net.IP) (*TestCA, error) {
	ca, err := newCA("hookwright-harness-ca", pkiValidity)
	if err != nil {
		return nil, err
	}
	serving, servingKey, err := ca.issue(&x509.Certificate{
		Subject: pkix.Name{CommonName: "kube-apiserver"},
		DNSNames: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
			"kubernetes.default.svc.cluster.local"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback, serviceIP},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return nil, err
	}
	client, clientKey, err := ca.issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: KubeletClientUser, Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return nil, err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	saDER, err := x509.MarshalECPrivateKey(saKey)
	if err != nil {
		return nil, err
	}
	saPub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	for name, data := range map[string][]byte{
		pkiCA:            ca.CertPEM,
		pkiServingCert:   serving,
		pkiServingKey:    servingKey,
		pkiKubeletClient: client,
		pkiKubeletKey:    clientKey,
		pkiSAKey:         pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: saDER}),
		pkiSAPublic:      pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPub}),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return nil, err
		}
	}
	return ca, nil
}

// writeKubeletServing writes a kubelet serving certificate for the node's
// name and IP (what the API server verifies with
// --kubelet-certificate-authority) and returns the cert and key paths.
func writeKubeletServing(ca *TestCA, dir, nodeName string, ip net.IP) (certFile, keyFile string, err error) {
	c, k, err := ca.issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "system:node:" + nodeName, Organization: []string{"system:nodes"}},
		DNSNames:    []string{nodeName},
		IPAddresses: []net.IP{ip},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return "", "", err
	}
	certFile, keyFile = filepath.Join(dir, "kubelet-serving.crt"), filepath.Join(dir, "kubelet-serving.key")
	if err := os.WriteFile(certFile, c, 0o600); err != nil {
		return "", "", err
	}
	return certFile, keyFile, os.WriteFile(keyFile, k, 0o600)
}

// firstIP is the first address of cidr, the kubernetes Service's ClusterIP
// (pkg/controlplane/services.go: ServiceIPRange).
func firstIP(cidr string) (net.IP, error) {
	_, n, err := net.ParseCIDR(cidr)
	if err != nil {
		return nil, fmt.Errorf("service CIDR %q: %w", cidr, err)
	}
	v := new(big.Int).SetBytes(n.IP)
	v.Add(v, big.NewInt(1))
	b := v.Bytes()
	ip := make(net.IP, len(n.IP))
	copy(ip[len(ip)-len(b):], b)
	return ip, nil
}
