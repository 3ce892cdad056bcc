package sources

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// The installation's state is owned by the CRDs that exist and are not
// being deleted; none when both are going (then nothing is created).
func TestInstallationOwners(t *testing.T) {
	s := runtime.NewScheme()
	if err := apiextensionsv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	crd := func(name, uid string, deleting bool) client.Object {
		c := &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(uid)}}
		if deleting {
			c.DeletionTimestamp = &metav1.Time{Time: time.Unix(1, 0)}
			c.Finalizers = []string{"customresourcecleanup.apiextensions.k8s.io"}
		}
		return c
	}
	ref := func(name, uid string) metav1.OwnerReference {
		return metav1.OwnerReference{APIVersion: "apiextensions.k8s.io/v1", Kind: "CustomResourceDefinition", Name: name, UID: types.UID(uid)}
	}
	si, no := InstallationCRDs[0], InstallationCRDs[1]
	for _, tc := range []struct {
		name string
		objs []client.Object
		want []metav1.OwnerReference
	}{
		{"both", []client.Object{crd(si, "u1", false), crd(no, "u2", false), crd("other.example.com", "u3", false)}, []metav1.OwnerReference{ref(si, "u1"), ref(no, "u2")}},
		{"one deleting", []client.Object{crd(si, "u1", true), crd(no, "u2", false)}, []metav1.OwnerReference{ref(no, "u2")}},
		{"one missing", []client.Object{crd(si, "u1", false)}, []metav1.OwnerReference{ref(si, "u1")}},
		{"none", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientBuilder().WithScheme(s).WithObjects(tc.objs...).Build()
			got, err := InstallationOwners(context.Background(), c)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("owners (-want +got):\n%s", diff)
			}
			// Controller and blockOwnerDeletion stay unset: deleting a CRD
			// never waits, and no finalizers permission is needed.
			for _, o := range got {
				if o.Controller != nil || o.BlockOwnerDeletion != nil {
					t.Errorf("owner %s sets controller or blockOwnerDeletion", o.Name)
				}
			}
		})
	}
	if got := MissingOwners([]metav1.OwnerReference{ref(si, "u1")}, []metav1.OwnerReference{ref(si, "u1"), ref(no, "u2")}); cmp.Diff([]metav1.OwnerReference{ref(no, "u2")}, got) != "" {
		t.Errorf("MissingOwners = %v", got)
	}
}
