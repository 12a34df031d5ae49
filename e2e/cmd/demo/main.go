// Command demo shows the supervisor at work: it runs Job pods in the pod
// simulation of package e2e/pod (real processes, real namespaces) and
// prints each pod's timeline as it happens, then its outcome. Needs root.
//
//	go run ./cmd/demo            a Job that succeeds, then one that fails
//	go run ./cmd/demo -only ok   just the one that succeeds
//	go run ./cmd/demo -real      with Istio's real pilot-agent (built from
//	                             the Go module proxy on first use, ~2 min)
//	go run ./cmd/demo -runc      every container a real runc container
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/pod"
	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/scenarios"
)

func main() {
	only := flag.String("only", "", "run just one pod: ok, fail or control")
	real := flag.Bool("real", false, "run Istio's real pilot-agent (with a stand-in envoy) in istio-proxy")
	useRunc := flag.Bool("runc", false, "make every container a runc container (installs runc if missing)")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "demo: needs root, to create the pod's namespaces and cgroups (try: sudo e2e/demo.sh)")
		os.Exit(1)
	}
	if err := run(*only, *real, *useRunc); err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		os.Exit(1)
	}
}

type demo struct {
	key, title string
	desc       scenarios.Desc
	wait       time.Duration
}

func run(only string, real, useRunc bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	fmt.Println("building the supervisor and the pod helpers ...")
	tl, err := pod.BuildTools(ctx)
	if err != nil {
		return err
	}
	defer os.RemoveAll(tl.Dir)
	build := func(d scenarios.Desc) (scenarios.Built, error) { return scenarios.BuildNamespaces(d, tl) }
	if useRunc {
		fmt.Println("finding runc and building the supervisor's image ...")
		runc, err := pod.FindRunc(ctx)
		if err != nil {
			return err
		}
		build = func(d scenarios.Desc) (scenarios.Built, error) { return scenarios.BuildRunc(d, tl, runc) }
	}
	env := []string{"SUPERVISOR_LOG_FORMAT=console", "SUPERVISOR_STOP_TIMEOUT=10s"}
	demos := []demo{
		{"ok", "a Job whose app succeeds: pilot-agent gets SIGTERM, the pod Succeeds",
			scenarios.Desc{Name: "job-ok", SupervisorEnv: env, ProxyEnv: []string{"PILOT_DRAIN=1s"},
				Apps: []scenarios.App{{Name: "app", UID: 1000, Args: []string{"--sleep", "2s"}}}}, time.Minute},
		{"fail", "a Job whose app exits 3: pilot-agent gets SIGKILL, the pod Fails",
			scenarios.Desc{Name: "job-fail", SupervisorEnv: env,
				Apps: []scenarios.App{{Name: "app", UID: 1000, Args: []string{"--sleep", "2s", "--exit", "3"}}}}, time.Minute},
		{"control", "the same Job without the supervisor: the pod never completes (we give up after 5s)",
			scenarios.Desc{Name: "job-control", NoSupervisor: true,
				Apps: []scenarios.App{{Name: "app", UID: 1000, Args: []string{"--sleep", "1s"}}}}, 5 * time.Second},
	}
	if real {
		fmt.Println("building Istio's pilot-agent (first run only) ...")
	}
	for _, d := range demos {
		if only != "" && only != d.key {
			continue
		}
		if real {
			// As with holdApplicationUntilProxyStarts: istio-proxy first,
			// the apps once pilot-agent is ready.
			d.desc.Proxy, d.desc.HoldApp, d.desc.ProxyDrain = scenarios.RealPilot, true, 2*time.Second
			d.title = strings.Replace(d.title, "pilot-agent", "the real pilot-agent", 1)
		}
		if err := show(ctx, d, build); err != nil {
			return err
		}
	}
	return nil
}

func show(ctx context.Context, d demo, build func(scenarios.Desc) (scenarios.Built, error)) error {
	fmt.Printf("\n=== %s\n", d.title)
	built, err := build(d.desc)
	if err != nil {
		return err
	}
	built.Spec.Log = os.Stdout
	var names []string
	for _, c := range built.Spec.Containers {
		names = append(names, c.Name)
	}
	fmt.Printf("pod %s, containers in order: %s (shareProcessNamespace: true, %s backend)\n\n",
		d.desc.Name, strings.Join(names, ", "), built.Backend.Name())
	start := time.Now()
	p, err := pod.Start(ctx, built.Backend, built.Spec)
	if err != nil {
		return err
	}
	defer func() { p.Close(); os.RemoveAll(built.Dir) }()
	wctx, cancel := context.WithTimeout(ctx, d.wait)
	defer cancel()
	st, err := p.WaitPhase(wctx)
	fmt.Println()
	if err != nil {
		fmt.Printf("after %.1fs the pod is still %s: %s\n", time.Since(start).Seconds(), st.Phase, st)
		return nil
	}
	fmt.Printf("after %.1fs the pod is %s:", time.Since(start).Seconds(), st.Phase)
	for _, c := range st.Containers {
		fmt.Printf(" %s exit %d;", c.Name, c.ExitCode)
	}
	fmt.Println()
	if msg := p.TerminationMessage("supervisor"); msg != "" {
		fmt.Printf("supervisor's termination message (kubectl describe pod shows it): %s\n", msg)
	}
	return nil
}
