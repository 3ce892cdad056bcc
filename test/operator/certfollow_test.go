package operator

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
)

// followSecret copies sec's certificate and key into srv's --cert-dir
// whenever they change, delay after the change (a kubelet's sync period
// and cache TTL; 0 at once), as the kubelet updates a mounted Secret
// (certwatcher reloads them), and then calls copied (may be nil); until
// ctx ends. It watches the one Secret: a dozen tests follow one for
// minutes, and polling each every 50 ms was a third of the API server's
// requests in this package.
func followSecret(ctx context.Context, sec *corev1.Secret, srv *localServer, delay time.Duration, copied func()) {
	last := sec.Data[corev1.TLSCertKey]
	secrets := env.Clientset.CoreV1().Secrets(sec.Namespace)
	one := fields.OneTermEqualSelector("metadata.name", sec.Name).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = one
			return secrets.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = one
			return secrets.Watch(ctx, o)
		},
	}
	// Ends with ctx's error only: the condition never holds.
	_, _ = watchtools.UntilWithSync(ctx, lw, &corev1.Secret{}, nil, func(ev watch.Event) (bool, error) {
		cur, ok := ev.Object.(*corev1.Secret)
		if !ok || ev.Type == watch.Deleted || bytes.Equal(cur.Data[corev1.TLSCertKey], last) {
			return false, nil
		}
		if delay > 0 {
			select {
			case <-ctx.Done():
				return false, ctx.Err()
			case <-time.After(delay):
			}
		}
		for _, f := range []string{corev1.TLSPrivateKeyKey, corev1.TLSCertKey} {
			tmp := filepath.Join(srv.certDir, "."+f+".tmp")
			if err := os.WriteFile(tmp, cur.Data[f], 0o600); err == nil {
				_ = os.Rename(tmp, filepath.Join(srv.certDir, f))
			}
		}
		last = cur.Data[corev1.TLSCertKey]
		if copied != nil {
			copied()
		}
		return false, nil
	})
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
	go func() { defer close(done); followSecret(ctx, sec, s, 0, nil) }()
	t.Cleanup(func() { cancel(); <-done })
}
