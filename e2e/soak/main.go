// Command soak runs hundreds of Jobs with random timelines on the one-node
// Kubernetes of e2e/cluster, each injected by Istio's own injector with our
// template (deploy/istio/supervisor.tmpl), and checks on every Job that
//
//   - it reaches the condition its timeline says (Complete, or Failed for
//     the reason it says), with the pods, app instances and exit codes it
//     says;
//   - istio-proxy is never stopped while an app of its pod still runs or
//     will run again: each app instance stamps its start and end (adjtimex,
//     nanoseconds), the supervisor logs when it signals istio-proxy
//     (milliseconds), and every stop must come after every end;
//   - no container is left running once the pod is done, neither in the
//     kubelet's status nor in the runtime (crictl);
//   - the supervisor's termination message says success, failure or
//     unknown as the apps' statuses say (or that the pod was deleted), and
//     istio-proxy got the action that goes with it;
//   - the supervisor restarted only where the soak killed it (kill.go):
//     then once, and the instance after carried on from the journal of the
//     one before and stopped istio-proxy within 3 s of when it would have
//     without the kill (plus the restart wait where an app's status was
//     lost under OnFailure: it ended while no supervisor ran; plus the
//     look, SUPERVISOR_APP_START_TIMEOUT, where an app ran wholly while
//     none ran); a kill after the supervisor's action, in a pod that then
//     ends, is not restarted and its 137 is no failure.
//
// The timelines are drawn from a seed, which the report prints: exit codes,
// runs from milliseconds to tens of seconds, restartPolicy Never and
// OnFailure with failures before success, one to three apps, pods deleted
// mid-run, activeDeadlineSeconds, and the exit-status method forced to none
// on some; in about one Job in ten the supervisor of one pod is SIGKILLed
// from the node (while an app runs, around an app's end, or during the
// stop), in the native shape under Never, either shape under OnFailure.
// Jobs run a window at a time (-parallel), and mid-soak the node's
// kubelet, then its containerd, are restarted once (e2e/scripts/
// cluster-restart.sh); the Jobs running across each restart get rows of
// their own. It prints one markdown document (the run's conditions, one
// table, each violation) and exits 1 if any invariant failed.
//
//	sudo e2e/soak.sh                     # 200 Jobs, a fresh seed
//	sudo e2e/soak.sh -seed 7 -only 17    # Job 17 of seed 7 again, alone
//	sudo e2e/soak.sh -standby            # every pod with a standby supervisor
//	go -C e2e run ./soak -h              # every option
//
// As root: it starts (or joins) the cluster and reads the apps' stamps on
// this node. Run it under flock /tmp/sidecar-supervisor-cluster.lock: it
// restarts the node's daemons.
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/jobprog"
)

type options struct {
	seed       uint64
	jobs       int
	parallel   int
	restarts   bool
	only       []int
	jobTimeout time.Duration
	out        string
	standby    bool
}

func main() {
	var o options
	var seed, only string
	flag.StringVar(&seed, "seed", "", "the timelines' seed (default: a fresh one, printed)")
	flag.IntVar(&o.jobs, "jobs", 200, "how many Jobs")
	flag.IntVar(&o.parallel, "parallel", 12, "how many Jobs run at once (the node's 2 cores hold about this many pods with their istio-proxy)")
	flag.BoolVar(&o.restarts, "restarts", true, "restart the kubelet after a third of the Jobs have started, and containerd after two thirds")
	flag.BoolVar(&o.standby, "standby", false, "give every Job's pod a standby supervisor (the template's standby annotation): a killed supervisor's successor is the standby, not the kubelet's restart")
	flag.StringVar(&only, "only", "", "comma-separated Job indices to run, alone (to replay Jobs of a seed)")
	flag.DurationVar(&o.jobTimeout, "job-timeout", 10*time.Minute, "bound on one Job; past it the Job counts as not finished (a failed run whose restart ran unseen is awaited SUPERVISOR_RESTART_TIMEOUT, 5m30s)")
	flag.StringVar(&o.out, "out", "", "directory for the details of the Jobs that failed or whose supervisor was killed (default: a new one under /tmp, made only for such Jobs)")
	flag.Parse()
	jobprog.Main("soak", o.parse(seed, only), func(ctx context.Context) (bool, error) {
		return run(ctx, o, os.Stdout)
	})
}

func (o *options) parse(seed, only string) error {
	if seed == "" {
		o.seed = rand.Uint64N(1_000_000) // short enough to type again
	} else {
		s, err := strconv.ParseUint(seed, 10, 64)
		if err != nil {
			return fmt.Errorf("-seed %q: want a whole number ≥ 0", seed)
		}
		o.seed = s
	}
	if only != "" {
		for _, f := range strings.Split(only, ",") {
			i, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || i < 0 {
				return fmt.Errorf("-only %q: want comma-separated Job indices (0, 1, ...)", only)
			}
			o.only = append(o.only, i)
		}
	}
	switch {
	case o.jobs < 1 && len(o.only) == 0:
		return fmt.Errorf("-jobs %d: want at least 1", o.jobs)
	case o.parallel < 1:
		return fmt.Errorf("-parallel %d: want at least 1", o.parallel)
	case o.jobTimeout < 2*time.Minute:
		return fmt.Errorf("-job-timeout %s: want at least 2m (OnFailure back-offs, pilot-agent's drain)", o.jobTimeout)
	}
	return nil
}

// logf is jobprog.Logf: progress to stderr, stdout being the report's.
var logf = jobprog.Logf
