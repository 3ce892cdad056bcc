package scenarios

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	operatorsv1 "github.com/operator-framework/api/pkg/operators/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hookwright/hookwright/test/cluster"
	"github.com/hookwright/hookwright/test/olm"
)

// READMEOLM runs the last line of the README's "OLM without Docker" block
// (READMEBlock), make cleanup-bundle, after the scenarios; scenario 7 ran
// the lines before it (RunBundle), so the block runs once, as written, as
// a user with a running make demo would run it (Shell: DEMO_DIR is the
// stack's directory). The last make cleanup-bundle must leave no object
// of any listable kind, cluster-scoped or in OperatorNamespace or OLM's
// namespace, that was not there after the first one (Events aside), OLM's
// Operator object included: what scenarios 8 and 9 made in between they
// removed.
//
// It is not one of All: the demo leaves scenario 7's install running, and
// this line ends with none. test/e2e runs it last.
func READMEOLM(ctx context.Context, e *Env, r *Result) error {
	lines, err := READMEBlock()
	if err != nil {
		return err
	}
	b := e.readme
	if b == nil {
		return fmt.Errorf("scenario 7 did not run the README block's first %d lines", len(lines)-1)
	}
	if err := e.readmeLine(ctx, r, b, lines[len(lines)-1]); err != nil {
		return err
	}
	if b.cleanups < 2 {
		return fmt.Errorf("README block %q: want %s first and last", lines, cleanupLine)
	}
	e.readme = nil
	r.timing("the README block's commands, added up (the issue's bound: 2 min)", b.total, 2*time.Minute)
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
