// Package desired builds, as pure functions of a custom resource and the
// operator's settings, every object the operator owns for it (ServiceAccount,
// RBAC, Deployment, PodDisruptionBudget, Service, webhook configurations,
// serving and CA Secrets, cert-manager objects) and the names they carry.
//
// It must not import a Kubernetes client (controller-runtime's client,
// client-go's clientsets) nor anything that does: nothing here reads or
// writes the API, so golden tests pin every object byte for byte. Nor may it
// import the webhook servers: the constants it shares with the injector
// live in api/v1alpha1 (internal/importrules checks the whole closure).
package desired
