package cluster

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ToyWebhook is a minimal mutating admission webhook on a local TLS port, to
// prove that the API server reaches local servers through Services. It adds
// the label toy.hookwright.io/mutated=true to every object it admits and
// counts requests per resource/subresource and user.
type ToyWebhook struct {
	Addr string
	srv  *http.Server
	ln   net.Listener

	mu    sync.Mutex
	calls map[string]int // "nodes/status" -> n
	users map[string]int
	total atomic.Int64
}

// StartToyWebhook serves with a certificate for dnsNames signed by ca.
func StartToyWebhook(ca *TestCA, dnsNames ...string) (*ToyWebhook, error) {
	certPEM, keyPEM, err := ca.Serving(dnsNames...)
	if err != nil {
		return nil, err
	}
	return StartToyWebhookPEM(certPEM, keyPEM)
}

// StartToyWebhookPEM serves with the given certificate (chain) and key.
func StartToyWebhookPEM(certPEM, keyPEM []byte) (*ToyWebhook, error) {
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	return startToyWebhook(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
}

// StartToyWebhookFunc serves with the certificate (chain) and key that
// keyPair returns at each handshake: a certificate that is re-issued
// while the server runs (a rotating CA) is served as a kubelet-refreshed
// Secret volume would serve it.
func StartToyWebhookFunc(keyPair func() (certPEM, keyPEM []byte, err error)) (*ToyWebhook, error) {
	return startToyWebhook(&tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		c, k, err := keyPair()
		if err != nil {
			return nil, err
		}
		cert, err := tls.X509KeyPair(c, k)
		return &cert, err
	}})
}

func startToyWebhook(cfg *tls.Config) (*ToyWebhook, error) {
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		return nil, err
	}
	t := &ToyWebhook{Addr: ln.Addr().String(), ln: ln, calls: map[string]int{}, users: map[string]int{}}
	t.srv = &http.Server{Handler: http.HandlerFunc(t.serve)}
	go func() { _ = t.srv.Serve(ln) }()
	return t, nil
}

// Close stops the server.
func (t *ToyWebhook) Close() error { return t.srv.Close() }

// Calls is the number of reviews seen for resource ("configmaps", "nodes/status").
func (t *ToyWebhook) Calls(resource string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.calls[resource]
}

// UserCalls is the number of reviews whose request came from user.
func (t *ToyWebhook) UserCalls(user string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.users[user]
}

func (t *ToyWebhook) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 3<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	review := admissionv1.AdmissionReview{}
	if err := json.Unmarshal(body, &review); err != nil || review.Request == nil {
		http.Error(w, fmt.Sprintf("bad AdmissionReview: %v", err), http.StatusBadRequest)
		return
	}
	req := review.Request
	res := req.Resource.Resource
	if req.SubResource != "" {
		res += "/" + req.SubResource
	}
	t.mu.Lock()
	t.calls[res]++
	t.users[req.UserInfo.Username]++
	t.mu.Unlock()
	t.total.Add(1)

	// Add the label; "add" on /metadata/labels needs the map to exist.
	var meta struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
	}
	_ = json.Unmarshal(req.Object.Raw, &meta)
	var patch string
	if meta.Metadata.Labels == nil {
		patch = `[{"op":"add","path":"/metadata/labels","value":{"toy.hookwright.io/mutated":"true"}}]`
	} else {
		patch = `[{"op":"add","path":"/metadata/labels/toy.hookwright.io~1mutated","value":"true"}]`
	}
	pt := admissionv1.PatchTypeJSONPatch
	review.Response = &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true, Patch: []byte(patch), PatchType: &pt}
	review.Request = nil
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(&review)
}
