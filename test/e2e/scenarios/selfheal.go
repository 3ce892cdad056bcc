package scenarios

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/test/cluster"
)

// injectionWorks waits until a dry-run pod in the lab namespace is injected
// (the API server's webhook informer may lag a re-created configuration).
func injectionWorks(ctx context.Context, e *Env, name string) (time.Duration, error) {
	return cluster.Poll(ctx, 5*time.Millisecond, 30*time.Second, "dry-run pod injected", func(ctx context.Context) (bool, error) {
		p, err := dryRunPod(ctx, e, name)
		if err != nil {
			return false, err
		}
		return injectedOnce(p) == nil, nil
	})
}

// ownedConfigs lists the operator's MutatingWebhookConfigurations.
func ownedConfigs(ctx context.Context, e *Env) ([]admissionregistrationv1.MutatingWebhookConfiguration, error) {
	var l admissionregistrationv1.MutatingWebhookConfigurationList
	err := e.Cluster.Client.List(ctx, &l, client.MatchingLabels{desired.LabelManagedBy: desired.ManagedByValue})
	return l.Items, err
}

// SelfHealing is scenario 4: a garbage caBundle is repaired and injection
// keeps working, a deleted configuration is recreated, and a CA swapped
// into the operator's --ca-dir the kubelet's way reaches every
// configuration.
func SelfHealing(ctx context.Context, e *Env, r *Result) error {
	c := e.Cluster.Client
	name := desired.SidecarKind.BaseName(SampleInjectorName)
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, mwc); err != nil {
		return err
	}
	good := mwc.Webhooks[0].ClientConfig.CABundle
	garbage := base64.StdEncoding.EncodeToString([]byte("-----BEGIN GARBAGE-----"))
	patch := fmt.Sprintf(`[{"op":"replace","path":"/webhooks/0/clientConfig/caBundle","value":%q}]`, garbage)
	if err := c.Patch(ctx, mwc, client.RawPatch(types.JSONPatchType, []byte(patch))); err != nil {
		return err
	}
	took, err := cluster.Poll(ctx, 5*time.Millisecond, 30*time.Second, "caBundle repaired", func(ctx context.Context) (bool, error) {
		m := &admissionregistrationv1.MutatingWebhookConfiguration{}
		if err := c.Get(ctx, client.ObjectKey{Name: name}, m); err != nil {
			return false, err
		}
		return bytes.Equal(m.Webhooks[0].ClientConfig.CABundle, good), nil
	})
	if err != nil {
		return err
	}
	r.timing("garbage caBundle → repaired", took, time.Second)
	if _, err := injectionWorks(ctx, e, "heal-1"); err != nil {
		return err
	}
	r.check("caBundle overwritten with garbage: repaired, and the next pod is injected")

	if err := c.Delete(ctx, &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		return err
	}
	took, err = cluster.Poll(ctx, 5*time.Millisecond, 30*time.Second, "configuration recreated", func(ctx context.Context) (bool, error) {
		m := &admissionregistrationv1.MutatingWebhookConfiguration{}
		err := c.Get(ctx, client.ObjectKey{Name: name}, m)
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil && len(m.Webhooks) == 1 && bytes.Equal(m.Webhooks[0].ClientConfig.CABundle, good), err
	})
	if err != nil {
		return err
	}
	r.timing("MutatingWebhookConfiguration deleted → recreated", took, time.Second)
	lag, err := injectionWorks(ctx, e, "heal-2")
	if err != nil {
		return err
	}
	r.check("MutatingWebhookConfiguration %s deleted: recreated; pods injected again %s later (API server's webhook informer)", name, lag.Round(time.Millisecond))

	configs, err := ownedConfigs(ctx, e)
	if err != nil {
		return err
	}
	if len(configs) < 2 {
		return fmt.Errorf("%d owned webhook configurations, want the injector's and the oversell's", len(configs))
	}
	ca, err := cluster.NewTestCA("hookwright-e2e-staged-ca")
	if err != nil {
		return err
	}
	carries := func(want bool) func(context.Context) (bool, error) {
		return func(ctx context.Context) (bool, error) {
			configs, err := ownedConfigs(ctx, e)
			if err != nil {
				return false, err
			}
			for _, m := range configs {
				for _, w := range m.Webhooks {
					if bytes.Contains(w.ClientConfig.CABundle, bytes.TrimSpace(ca.CertPEM)) != want {
						return false, nil
					}
				}
			}
			return true, nil
		}
	}
	// The kubelet's own update of this volume would come from the Secret,
	// which the operator owns (it rewrites ca.crt to its bundle); so the
	// swap is made in the volume as the kubelet's atomic writer makes it.
	dirs, err := e.CADirs(ctx)
	if err != nil {
		return err
	}
	// The kubelet remounts a Secret volume at its periodic pod sync
	// (about once a minute) and so puts the Secret's content back over
	// the swap; the product then publishes that, as it should. When it
	// does, the swap is made again and timed from there.
	var swapped time.Time
	stage := func() error {
		for _, d := range dirs {
			if err := cluster.WriteAtomicDir(d, map[string][]byte{"ca.crt": ca.CertPEM}, 0o644); err != nil {
				return err
			}
		}
		swapped = time.Now()
		return nil
	}
	if err := stage(); err != nil {
		return err
	}
	restaged := 0
	_, err = cluster.Poll(ctx, 5*time.Millisecond, 60*time.Second, "new CA in every caBundle", func(ctx context.Context) (bool, error) {
		for _, d := range dirs {
			if b, err := os.ReadFile(filepath.Join(d, "ca.crt")); err == nil && !bytes.Equal(b, ca.CertPEM) {
				restaged++
				return false, stage()
			}
		}
		return carries(true)(ctx)
	})
	if err != nil {
		return fmt.Errorf("%w (the swap made %d times)", err, restaged+1)
	}
	took = time.Since(swapped)
	if restaged > 0 {
		r.check("the kubelet's remount of the Secret volume undid the swap %d times; swapped again each time", restaged)
	}
	r.timing("..data swap of --ca-dir → new CA in every caBundle", took, 2*time.Second)
	if _, err := injectionWorks(ctx, e, "heal-3"); err != nil {
		return err
	}
	r.check("CA files replaced by a ..data symlink swap: all %d configurations carry the new CA; injection still works", len(configs))
	for _, d := range dirs {
		if err := cluster.WriteAtomicDir(d, map[string][]byte{}, 0o644); err != nil {
			return err
		}
	}
	took, err = cluster.Poll(ctx, 5*time.Millisecond, 60*time.Second, "staged CA removed from every caBundle", carries(false))
	if err != nil {
		return err
	}
	r.check("CA removed from --ca-dir: gone from every caBundle %s later", took.Round(time.Millisecond))
	return nil
}
