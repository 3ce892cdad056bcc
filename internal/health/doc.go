// Package health decides, as pure functions of what the operator read, the
// conditions that report how a CR's servers and the operator are doing:
// ServerPodsHealthy (pods.go: the kubelet's reasons in pod status and
// Events), ConfigLoaded (configloaded.go: the generation each ready pod
// serves), EndpointsOwned (endpoints.go: what stands behind a webhook
// Service), OLM's Upgradeable (upgradeable.go), the failurePolicy
// in effect, FailurePolicyEnforced (failurepolicy.go), and whether a
// server Deployment may roll now or waits for another one,
// ServerRolloutWaiting (serverrollout.go).
//
// controllers reads the objects and writes the conditions; this package
// must not import a client, controllers or the webhook servers.
package health
