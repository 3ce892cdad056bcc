package operator

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// followSecret copies sec's certificate and key into srv's --cert-dir
// whenever they change, as the kubelet updates a mounted Secret
// (certwatcher reloads them), until ctx ends.
func followSecret(ctx context.Context, sec *corev1.Secret, srv *localServer) {
	last := sec.Data[corev1.TLSCertKey]
	for ctx.Err() == nil {
		cur := &corev1.Secret{}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(sec), cur); err == nil && !bytes.Equal(cur.Data[corev1.TLSCertKey], last) {
			for _, f := range []string{corev1.TLSPrivateKeyKey, corev1.TLSCertKey} {
				tmp := filepath.Join(srv.certDir, "."+f+".tmp")
				if err := os.WriteFile(tmp, cur.Data[f], 0o600); err == nil {
					_ = os.Rename(tmp, filepath.Join(srv.certDir, f))
				}
			}
			last = cur.Data[corev1.TLSCertKey]
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// follow keeps s's --cert-dir equal to the Secret sec until the test
// ends. The operator's test CA rotates every 6.5 min (testCAPolicy) and
// leaves the caBundle testDrainGrace after it re-issued the serving
// certificate: a server still presenting the first one is then refused
// by the API server (tls: bad certificate) and, with failurePolicy
// Ignore, silently not called.
func (s *localServer) follow(t *testing.T, sec *corev1.Secret) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); followSecret(ctx, sec, s) }()
	t.Cleanup(func() { cancel(); <-done })
}
