package app

import (
	"context"
	"errors"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/hookwright/hookwright/internal/desired"
)

// TestFailOpenAllSwitchesOnlyOurs: every webhook of the configurations
// the operator manages ends Ignore, the validating one included; a
// configuration already Ignore and one it does not manage are not written.
func TestFailOpenAllSwitchesOnlyOurs(t *testing.T) {
	fail, ignore := admissionregistrationv1.Fail, admissionregistrationv1.Ignore
	ours := map[string]string{desired.LabelManagedBy: desired.ManagedByValue}
	mwc := func(name string, labels map[string]string, ps ...*admissionregistrationv1.FailurePolicyType) *admissionregistrationv1.MutatingWebhookConfiguration {
		m := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
		for i, p := range ps {
			m.Webhooks = append(m.Webhooks, admissionregistrationv1.MutatingWebhook{Name: name + "-" + string(rune('a'+i)) + ".example.com", FailurePolicy: p})
		}
		return m
	}
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: desired.ValidatingConfigName},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{Name: "v.example.com", FailurePolicy: &fail}}}
	cs := fake.NewClientset(
		mwc("mixed", ours, &fail, nil, &ignore),
		mwc("open", ours, &ignore),
		mwc("foreign", nil, &fail),
		vwc,
	)
	ctx := context.Background()
	if err := failOpenAll(ctx, cs); err != nil {
		t.Fatalf("failOpenAll: %v", err)
	}
	for _, name := range []string{"mixed", "open"} {
		m, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range m.Webhooks {
			if w.FailurePolicy == nil || *w.FailurePolicy != ignore {
				t.Errorf("%s webhook %s: failurePolicy %v, want Ignore", name, w.Name, w.FailurePolicy)
			}
		}
	}
	f, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "foreign", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if *f.Webhooks[0].FailurePolicy != fail {
		t.Error("a configuration hookwright does not manage was switched")
	}
	v, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, desired.ValidatingConfigName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if *v.Webhooks[0].FailurePolicy != ignore {
		t.Error("the operator's validating webhook was not switched to Ignore")
	}
	var patched []string
	for _, a := range cs.Actions() {
		if a.GetVerb() == "patch" {
			patched = append(patched, a.(interface{ GetName() string }).GetName())
		}
	}
	if len(patched) != 2 || patched[0] != "mixed" || patched[1] != desired.ValidatingConfigName {
		t.Errorf("patched %q, want only mixed and %s (already Ignore and foreign ones are not written)", patched, desired.ValidatingConfigName)
	}
}

// TestAllForbidden: only answers that are all Forbidden stop the retries
// (the operator's RBAC is gone); any other failure is tried again.
func TestAllForbidden(t *testing.T) {
	gr := schema.GroupResource{Group: "admissionregistration.k8s.io", Resource: "mutatingwebhookconfigurations"}
	forbidden := apierrors.NewForbidden(gr, "x", errors.New("no RBAC"))
	conflict := apierrors.NewConflict(gr, "x", errors.New("changed"))
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"forbidden", forbidden, true},
		{"all forbidden", errors.Join(forbidden, forbidden), true},
		{"forbidden and a conflict", errors.Join(forbidden, conflict), false},
		{"a timeout", context.DeadlineExceeded, false},
	} {
		if got := allForbidden(tc.err); got != tc.want {
			t.Errorf("%s: allForbidden = %v, want %v", tc.name, got, tc.want)
		}
	}
}
