package pki_test

import (
	"fmt"
	"time"

	"github.com/hookwright/hookwright/internal/certificates/pki"
)

// A reconciler loop: plan, carry out the step (here with Apply; a real
// reconciler writes the resulting Secrets and webhook configurations and
// reads them back), and repeat until there is nothing to do.
func ExamplePlan() {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	s := pki.State{
		Published: map[string][]byte{"MutatingWebhookConfiguration/hw-injector": nil},
		Serving: map[string]pki.Serving{
			"hookwright-system/hw-injector-tls": {DNSNames: pki.ServingDNSNames("hw-injector", "hookwright-system", "")},
		},
	}
	for {
		step, err := pki.Plan(s, now, pki.Policy{})
		if err != nil {
			panic(err)
		}
		fmt.Println(step.Kind, step.Reason, step.Configs, step.Targets)
		if step.Kind == pki.StepNone {
			fmt.Println("requeue after", step.RequeueAfter.Round(time.Hour))
			break
		}
		if s, err = pki.Apply(s, step, now, pki.Policy{}); err != nil {
			panic(err)
		}
	}
	// Output:
	// CreateCA NoCA [] []
	// PublishBundle BundleOutdated [MutatingWebhookConfiguration/hw-injector] []
	// IssueServing Missing [] [hookwright-system/hw-injector-tls]
	// None UpToDate [] []
	// requeue after 1440h0m0s
}
