// Command demo shows the supervisor at work: it runs Job pods in the pod
// simulation of package e2e/pod (real processes, real namespaces) and
// prints each pod's timeline as it happens, then its outcome. Needs root.
//
//	go run ./cmd/demo            a Job that succeeds, then one that fails
//	go run ./cmd/demo -only ok   just the one that succeeds
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
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "demo: needs root, to create the pod's namespaces and cgroups (try: sudo e2e/demo.sh)")
		os.Exit(1)
	}
	if err := run(*only); err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		os.Exit(1)
	}
}

type demo struct {
	key, title string
	desc       scenarios.Desc
	wait       time.Duration
}

func run(only string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	fmt.Println("building the supervisor and the pod helpers ...")
	tl, err := pod.BuildTools(ctx)
	if err != nil {
		return err
	}
	defer os.RemoveAll(tl.Dir)
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
	for _, d := range demos {
		if only != "" && only != d.key {
			continue
		}
		if err := show(ctx, d, tl); err != nil {
			return err
		}
	}
	return nil
}

func show(ctx context.Context, d demo, tl pod.Tools) error {
	fmt.Printf("\n=== %s\n", d.title)
	built, err := scenarios.BuildNamespaces(d.desc, tl)
	if err != nil {
		return err
	}
	built.Spec.Log = os.Stdout
	var names []string
	for _, c := range built.Spec.Containers {
		names = append(names, c.Name)
	}
	fmt.Printf("pod %s, containers in order: %s (shareProcessNamespace: true)\n\n", d.desc.Name, strings.Join(names, ", "))
	start := time.Now()
	p, err := pod.Start(ctx, built.Backend, built.Spec)
	if err != nil {
		return err
	}
	defer p.Close()
	wctx, cancel := context.WithTimeout(ctx, d.wait)
	defer cancel()
	st, err := p.WaitPhase(wctx)
	fmt.Println()
	if err != nil {
		fmt.Printf("after %.1fs the pod is still %s: %s\n", time.Since(start).Seconds(), st.Phase, st)
		return nil
	}
	// Let the containers' last lines arrive before the summary.
	time.Sleep(100 * time.Millisecond)
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
