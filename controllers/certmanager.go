package controllers

import (
	metricsv1beta1 "k8s.io/metrics/pkg/apis/metrics/v1beta1"
	"sync"

	cmapi "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
	operatorsv2 "github.com/operator-framework/api/pkg/operators/v2"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

// In mode CertManager the operator owns a cert-manager Certificate (and a
// self-signed Issuer when the CR names none) in the server namespace
// (internal/certificates/sources).
// +kubebuilder:rbac:groups=cert-manager.io,namespace=system,resources=certificates;issuers,verbs=get;list;watch;create;patch;delete

// AddToScheme registers the third-party kinds the controllers read and
// write (cert-manager's Certificate and Issuer, OLM's OperatorCondition) on
// top of client-go's and hookwright's.
func AddToScheme(s *runtime.Scheme) error {
	if err := cmapi.AddToScheme(s); err != nil {
		return err
	}
	// metrics.k8s.io, read by the usage-aware NodeOversell.
	if err := metricsv1beta1.AddToScheme(s); err != nil {
		return err
	}
	return operatorsv2.AddToScheme(s)
}

// certManagerWatch adds the watch on owned cert-manager Certificates to a
// running controller once their CRD is served: a watch registered at start
// would fail the manager on a cluster without cert-manager.
type certManagerWatch struct {
	mu      sync.Mutex
	done    bool
	ctrl    controller.Controller
	cache   cache.Cache
	mapper  apimeta.RESTMapper
	scheme  *runtime.Scheme
	owner   client.Object
	started bool // ctrl is set (SetupWithManager ran)
}

// ensure starts the watch if it is not running yet.
func (w *certManagerWatch) ensure() error {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done || !w.started {
		return nil
	}
	h := handler.TypedEnqueueRequestForOwner[*cmapi.Certificate](w.scheme, w.mapper, w.owner, handler.OnlyControllerOwner())
	if err := w.ctrl.Watch(source.Kind(w.cache, &cmapi.Certificate{}, h)); err != nil {
		return err
	}
	w.done = true
	return nil
}

// running reports whether the watch was started.
func (w *certManagerWatch) running() bool {
	if w == nil {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.done
}
