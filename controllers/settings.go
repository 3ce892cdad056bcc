package controllers

import (
	"time"

	"github.com/hookwright/hookwright/internal/apply"
	"github.com/hookwright/hookwright/internal/certificates/sources"
	"github.com/hookwright/hookwright/internal/desired"
	"github.com/hookwright/hookwright/internal/webhookprobe"
)

// Settings are the operator-wide inputs of the reconcilers.
type Settings struct {
	// Settings are the inputs of the desired objects: operator namespace,
	// default server image, server policy, proxy environment.
	desired.Settings
	// Repairs limits drift repairs per owned object; zero values mean
	// apply.DefaultBudget.
	Repairs apply.Budget
	// Certificates tunes SelfSigned mode (CA and serving lifetimes,
	// rotation, clock, drain grace).
	Certificates sources.Settings
	// CADir, if set, is a directory of CA files (*.crt, *.pem; in-cluster
	// the CA Secret mounted as a volume) whose CAs are published in every
	// SelfSigned caBundle together with the operator's own CAs.
	CADir string
	// Webhook configures the manager's validating webhook for the CRs
	// (validation.go); a zero value disables it.
	Webhook WebhookSettings
	// CSR configures mode CSR (Trust nil: detected at setup; Clientset
	// nil: made from the manager's config).
	CSR sources.CSRSettings
	// FleetWriteInterval is the least time between two fleet status
	// writes of one SidecarInjector; zero means DefaultFleetWriteInterval.
	FleetWriteInterval time.Duration
	// Probe is the pace of the live check of each CR's webhook; a zero
	// value means webhookprobe.DefaultPolicy (one probe a minute).
	Probe webhookprobe.Policy
}
