package scenarios

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	operatorsv1 "github.com/operator-framework/api/pkg/operators/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/test/cluster"
	"github.com/hookwright/hookwright/test/olm"
)

// READMEOLM runs the README's "OLM without Docker" block (READMEBlock), each
// command as written, against this stack after the scenarios, as a user
// with a running `make demo` would (Shell: DEMO_DIR is the stack's
// directory), and checks what each command promises:
//
//   - the first make cleanup-bundle removes the install the scenarios left
//     (scenario 7's, or a later one's), its CRDs deleted;
//   - make run-bundle ends with the CSV hookwright.v0.1.0 Succeeded and its
//     operator pods Running and Ready in containerd on SystemNode;
//     config/samples are then applied through the operator's validating
//     webhook and become Ready;
//   - make run-bundle-upgrade VERSION=0.1.1: hookwright.v0.1.1 Succeeded,
//     the samples keep their UIDs;
//   - the last make cleanup-bundle leaves no object of any listable kind,
//     cluster-scoped or in OperatorNamespace or OLM's namespace, that was
//     not there after the first one (Events aside), OLM's Operator object
//     included.
//
// It is not one of All: the demo leaves scenario 7's install running, and
// this block ends with none. test/e2e runs it last.
func READMEOLM(ctx context.Context, e *Env, r *Result) error {
	lines, err := READMEBlock()
	if err != nil {
		return err
	}
	var before map[olm.ObjectKey]olm.ObjectInfo
	var crs map[string]types.UID
	cleanups := 0
	var total time.Duration
	for _, line := range lines {
		took, err := e.Shell(ctx, line)
		total += took
		r.timing(line, took, 0)
		if err != nil {
			return err
		}
		switch strings.TrimPrefix(line, "make ") {
		case "cleanup-bundle":
			cleanups++
			if err := e.crdsGone(ctx); err != nil {
				return err
			}
			if cleanups == 1 {
				if before, err = e.installScope(ctx); err != nil {
					return err
				}
				r.check("%s: the scenarios' install removed, its CRDs deleted; %d objects listed (cluster-scoped, %s, %s)", line, len(before), OperatorNamespace, olm.DefaultNamespace)
				continue
			}
			left, err := e.leftAfter(ctx, before)
			if err != nil {
				return err
			}
			r.check("%s: nothing of the install left among %d objects of every listable kind (OLM's Operator object included), Events aside", line, len(left))
		case "run-bundle":
			pods, err := e.checkCSV(ctx, csv010, ServerImage)
			if err != nil {
				return err
			}
			if crs, err = e.applySamples(ctx); err != nil {
				return err
			}
			r.check("%s: CSV %s Succeeded, operator pods %s Running and Ready in containerd; config/samples applied and Ready", line, csv010, strings.Join(pods, ", "))
		case "run-bundle-upgrade VERSION=0.1.1":
			if _, err := e.checkCSV(ctx, csv011, image011); err != nil {
				return err
			}
			if err := e.sameUIDs(ctx, crs); err != nil {
				return err
			}
			r.check("%s: CSV %s Succeeded, the samples kept their UIDs", line, csv011)
		}
	}
	if cleanups < 2 {
		return fmt.Errorf("README block %q: want make cleanup-bundle first and last", lines)
	}
	r.timing("the README block's commands, added up (the issue's bound: 2 min)", total, 2*time.Minute)
	return nil
}

// installScope snapshots what an install can leave: every listable object
// that is cluster-scoped or in OperatorNamespace or OLM's namespace.
func (e *Env) installScope(ctx context.Context) (map[olm.ObjectKey]olm.ObjectInfo, error) {
	all, err := olm.Snapshot(ctx, e.Cluster.Config)
	if err != nil {
		return nil, err
	}
	out := map[olm.ObjectKey]olm.ObjectInfo{}
	for k, v := range all {
		if k.Namespace == "" || k.Namespace == OperatorNamespace || k.Namespace == olm.DefaultNamespace {
			out[k] = v
		}
	}
	return out, nil
}

// leftAfter waits until installScope holds nothing new against before
// (the garbage collector and OLM delete dependents after cleanup returns)
// and returns the last snapshot.
func (e *Env) leftAfter(ctx context.Context, before map[olm.ObjectKey]olm.ObjectInfo) (map[olm.ObjectKey]olm.ObjectInfo, error) {
	var after map[olm.ObjectKey]olm.ObjectInfo
	var left []string
	err := cluster.WaitFor(ctx, 3*time.Minute, "nothing of the install left", func(ctx context.Context) (bool, error) {
		var err error
		if after, err = e.installScope(ctx); err != nil {
			return false, err
		}
		left = nil
		for _, k := range olm.NewObjects(before, after) {
			left = append(left, k.String()+" ("+after[k].String()+")")
		}
		// OLM's Operator object is cluster-scoped, so it is in scope;
		// make cleanup-bundle deletes it.
		c, err := e.client()
		if err != nil {
			return false, err
		}
		err = c.Get(ctx, client.ObjectKey{Name: "hookwright." + OperatorNamespace}, &operatorsv1.Operator{})
		if err == nil {
			left = append(left, "OLM's Operator hookwright."+OperatorNamespace)
		} else if !apierrors.IsNotFound(err) {
			return false, err
		}
		return len(left) == 0, nil
	})
	if err != nil {
		sort.Strings(left)
		return nil, fmt.Errorf("%w: left after make cleanup-bundle:\n  %s", err, strings.Join(left, "\n  "))
	}
	return after, nil
}
