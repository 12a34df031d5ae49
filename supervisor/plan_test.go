package supervisor

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sidecar-supervisor/sidecar-supervisor/procscan"
)

// TestStopPlan: every plan the stop can make, from the outcome, the
// settings and the sidecars (as the table of known sidecars and their
// command lines tell them), without a process, a clock or a request. Each
// sidecar's plan reads, in order: its action, its steps, the fallback of a
// failed POST ("else"), and its escalation. The plan is done by act and
// watchExits: the harness tests (run_test.go, handler_test.go,
// sidecars_test.go) run the same paths against fakes.
func TestStopPlan(t *testing.T) {
	const quit = "http://127.0.0.1:15020/quitquitquit"
	var (
		istioProxy = planned("istio-proxy", "pilot-agent")
		sqlQuit    = planned("cloud-sql-proxy", "cloud-sql-proxy", "/cloud-sql-proxy", "--quitquitquit", "--admin-port=9092", "p:r:i")
		sqlBare    = planned("cloud-sql-proxy", "cloud-sql-proxy", "/cloud-sql-proxy", "p:r:i")
		otel       = planned("otc-container", "otelcol-contrib")
		other      = planned("proxy", "my-proxy") // named in SIDECAR_PROCESSES, unknown to the table
		term       = []string{"wait until it handles SIGTERM (within 2s)", "SIGTERM"}
		kill       = "SIGKILL if up 2s after, given up 10s after that"
	)
	// lines is a sidecar's plan as the table reads it.
	lines := func(container, action string, steps ...string) []string {
		out := []string{container + ": " + action}
		for _, s := range steps {
			out = append(out, container+": "+s)
		}
		return out
	}
	join := func(plans ...[]string) []string {
		var out []string
		for _, p := range plans {
			out = append(out, p...)
		}
		return out
	}
	els := func(steps ...string) []string {
		var out []string
		for _, s := range steps {
			out = append(out, "else "+s)
		}
		return out
	}
	with := func(a []string, b ...string) []string { return append(append([]string{}, a...), b...) }
	tests := []struct {
		name     string
		env      []string
		outcome  Outcome
		sidecars []*sidecar
		want     []string
	}{
		// The outcome's action (ON_SUCCESS, ON_FAILURE, ON_UNKNOWN), for
		// Istio's sidecar and any the table does not know.
		{name: "success: SIGTERM once handled", outcome: Success, sidecars: []*sidecar{istioProxy},
			want: lines("istio-proxy", "SIGTERM", with(term, kill)...)},
		{name: "failure: SIGKILL needs no handler", outcome: Failure, sidecars: []*sidecar{istioProxy},
			want: lines("istio-proxy", "SIGKILL", "SIGKILL", kill)},
		{name: "unknown: SIGTERM once handled", outcome: Unknown, sidecars: []*sidecar{other},
			want: lines("proxy", "SIGTERM", with(term, kill)...)},
		{name: "a graceful signal of the settings waits for its handler", env: []string{"SUPERVISOR_ON_FAILURE=SIGINT"},
			outcome: Failure, sidecars: []*sidecar{istioProxy},
			want: lines("istio-proxy", "SIGINT", "wait until it handles SIGINT (within 2s)", "SIGINT", kill)},
		{name: "a signal that does not kill by default does not wait", env: []string{"SUPERVISOR_ON_UNKNOWN=SIGCONT"},
			outcome: Unknown, sidecars: []*sidecar{istioProxy},
			want: lines("istio-proxy", "SIGCONT", "SIGCONT", kill)},
		{name: "the bounds come from the settings",
			env:     []string{"SUPERVISOR_SIDECAR_START_TIMEOUT=7s", "SUPERVISOR_STOP_TIMEOUT=45s"},
			outcome: Success, sidecars: []*sidecar{istioProxy},
			want: lines("istio-proxy", "SIGTERM", "wait until it handles SIGTERM (within 7s)", "SIGTERM",
				"SIGKILL if up 45s after, given up 10s after that")},

		// An HTTP action: pilot-agent's quit is preceded by /drain on the
		// same port; a failed POST falls back to SIGTERM once handled.
		{name: "pilot-agent's quit: /drain first", env: []string{"SUPERVISOR_ON_SUCCESS=" + quit},
			outcome: Success, sidecars: []*sidecar{istioProxy},
			want: lines("istio-proxy", "POST "+quit, with(append([]string{
				"POST http://127.0.0.1:15020/drain, its answer awaited", "POST " + quit + " until answered"}, els(term...)...), kill)...)},
		{name: "pilot-agent's quit on another port, with a query: /drain on that port, without it",
			env: []string{"SUPERVISOR_ON_FAILURE=http://127.0.0.1:15021/quitquitquit?now=1"}, outcome: Failure,
			sidecars: []*sidecar{istioProxy},
			want: lines("istio-proxy", "POST http://127.0.0.1:15021/quitquitquit?now=1", with(append([]string{
				"POST http://127.0.0.1:15021/drain, its answer awaited",
				"POST http://127.0.0.1:15021/quitquitquit?now=1 until answered"}, els(term...)...), kill)...)},
		{name: "pilot-agent, a POST to another path: no /drain", env: []string{"SUPERVISOR_ON_SUCCESS=http://127.0.0.1:15000/quit"},
			outcome: Success, sidecars: []*sidecar{istioProxy},
			want: lines("istio-proxy", "POST http://127.0.0.1:15000/quit",
				with(append([]string{"POST http://127.0.0.1:15000/quit until answered"}, els(term...)...), kill)...)},
		{name: "a sidecar the table does not know: no /drain", env: []string{"SUPERVISOR_ON_SUCCESS=" + quit},
			outcome: Success, sidecars: []*sidecar{other},
			want: lines("proxy", "POST "+quit, with(append([]string{"POST " + quit + " until answered"}, els(term...)...), kill)...)},
		{name: "two sidecars, one URL: POSTed once, its result counts for both", env: []string{"SUPERVISOR_ON_SUCCESS=" + quit},
			outcome: Success, sidecars: []*sidecar{istioProxy, other},
			want: join(
				lines("istio-proxy", "POST "+quit, with(append([]string{
					"POST http://127.0.0.1:15020/drain, its answer awaited", "POST " + quit + " until answered"}, els(term...)...), kill)...),
				lines("proxy", "POST "+quit, with(append([]string{"as POSTed above: " + quit}, els(term...)...), kill)...))},
		{name: "the sidecar that POSTs first drains; the one after shares it", env: []string{"SUPERVISOR_ON_SUCCESS=" + quit},
			outcome: Success, sidecars: []*sidecar{other, istioProxy},
			want: join(
				lines("proxy", "POST "+quit, with(append([]string{"POST " + quit + " until answered"}, els(term...)...), kill)...),
				lines("istio-proxy", "POST "+quit, with(append([]string{"as POSTed above: " + quit}, els(term...)...), kill)...))},

		// SUPERVISOR_SIDECAR_ACTIONS, by process or container name,
		// whatever the outcome; named in the summary where it differs.
		{name: "its own signal, by process name", env: []string{"SUPERVISOR_SIDECAR_ACTIONS=cloud-sql-proxy=SIGINT"},
			outcome: Failure, sidecars: []*sidecar{istioProxy, planned("sql", "cloud-sql-proxy")},
			want: join(lines("istio-proxy", "SIGKILL", "SIGKILL", kill),
				lines("sql", "SIGINT (its own)", "wait until it handles SIGINT (within 2s)", "SIGINT", kill))},
		{name: "its own POST, by container name", env: []string{"SUPERVISOR_SIDECAR_ACTIONS=vault-agent=http://127.0.0.1:8200/quit"},
			outcome: Failure, sidecars: []*sidecar{planned("vault-agent", "vault")},
			want: lines("vault-agent", "POST http://127.0.0.1:8200/quit (its own)",
				with(append([]string{"POST http://127.0.0.1:8200/quit until answered"}, els(term...)...), kill)...)},
		{name: "none: left running, not awaited, never killed", env: []string{"SUPERVISOR_SIDECAR_ACTIONS=fluent-bit=none"},
			outcome: Success, sidecars: []*sidecar{istioProxy, planned("fluent-bit", "fluent-bit")},
			want: join(lines("istio-proxy", "SIGTERM", with(term, kill)...), lines("fluent-bit", "none (its own)", "leave it running"))},
		{name: "its own action, the outcome's too: not named", env: []string{"SUPERVISOR_SIDECAR_ACTIONS=fluent-bit=SIGTERM"},
			outcome: Success, sidecars: []*sidecar{planned("fluent-bit", "fluent-bit")},
			want: lines("fluent-bit", "SIGTERM", with(term, kill)...)},
		{name: "its own POST to the outcome's URL: named all the same (an Action's URL compares as a pointer)",
			env:     []string{"SUPERVISOR_ON_SUCCESS=" + quit, "SUPERVISOR_SIDECAR_ACTIONS=pilot-agent=" + quit},
			outcome: Success, sidecars: []*sidecar{istioProxy},
			want: lines("istio-proxy", "POST "+quit+" (its own)", with(append([]string{
				"POST http://127.0.0.1:15020/drain, its answer awaited", "POST " + quit + " until answered"}, els(term...)...), kill)...)},
		{name: "its own action wins over the table's", env: []string{"SUPERVISOR_SIDECAR_ACTIONS=cloud-sql-proxy=SIGINT"},
			outcome: Success, sidecars: []*sidecar{sqlQuit},
			want: lines("cloud-sql-proxy", "SIGINT (its own)", "wait until it handles SIGINT (within 2s)", "SIGINT", kill)},

		// The known sidecars other than Istio's: their HTTP stop where
		// their command line enables it, whatever the outcome; else
		// SIGTERM on success, the outcome's action otherwise.
		{name: "cloud-sql-proxy --quitquitquit, on its admin port", outcome: Failure, sidecars: []*sidecar{sqlQuit},
			want: lines("cloud-sql-proxy", "POST http://127.0.0.1:9092/quitquitquit (its own)",
				with(append([]string{"POST http://127.0.0.1:9092/quitquitquit until answered"}, els(term...)...), kill)...)},
		{name: "cloud-sql-proxy without --quitquitquit, on success: SIGTERM", outcome: Success, sidecars: []*sidecar{sqlBare},
			want: lines("cloud-sql-proxy", "SIGTERM", with(term, kill)...)},
		{name: "cloud-sql-proxy without --quitquitquit, on failure: the outcome's", outcome: Failure, sidecars: []*sidecar{sqlBare},
			want: lines("cloud-sql-proxy", "SIGKILL", "SIGKILL", kill)},
		{name: "a known sidecar gets SIGTERM on success, whatever ON_SUCCESS", env: []string{"SUPERVISOR_ON_SUCCESS=SIGINT"},
			outcome: Success, sidecars: []*sidecar{istioProxy, otel},
			want: join(lines("istio-proxy", "SIGINT", "wait until it handles SIGINT (within 2s)", "SIGINT", kill),
				lines("otc-container", "SIGTERM (its own)", with(term, kill)...))},
		{name: "a known sidecar without an HTTP stop, on unknown: the outcome's", env: []string{"SUPERVISOR_ON_UNKNOWN=SIGINT"},
			outcome: Unknown, sidecars: []*sidecar{otel},
			want: lines("otc-container", "SIGINT", "wait until it handles SIGINT (within 2s)", "SIGINT", kill)},
		{name: "daprd on its --dapr-http-port", outcome: Success,
			sidecars: []*sidecar{planned("daprd", "daprd", "/daprd", "--dapr-http-port", "3501")},
			want: lines("daprd", "POST http://127.0.0.1:3501/v1.0/shutdown (its own)",
				with(append([]string{"POST http://127.0.0.1:3501/v1.0/shutdown until answered"}, els(term...)...), kill)...)},
		{name: "consul-dataplane under dumb-init, on its -graceful-port", outcome: Unknown,
			sidecars: []*sidecar{planned("consul-dataplane", "dumb-init", "dumb-init", "--", "consul-dataplane", "-graceful-port=20600")},
			want: lines("consul-dataplane", "POST http://127.0.0.1:20600/graceful_shutdown (its own)",
				with(append([]string{"POST http://127.0.0.1:20600/graceful_shutdown until answered"}, els(term...)...), kill)...)},
		{name: "two of one known sidecar: its stop POSTed once", outcome: Success,
			sidecars: []*sidecar{planned("linkerd-proxy", "linkerd2-proxy"), planned("linkerd-proxy-2", "linkerd2-proxy")},
			want: join(
				lines("linkerd-proxy", "POST http://127.0.0.1:4191/shutdown (its own)",
					with(append([]string{"POST http://127.0.0.1:4191/shutdown until answered"}, els(term...)...), kill)...),
				lines("linkerd-proxy-2", "POST http://127.0.0.1:4191/shutdown (its own)",
					with(append([]string{"as POSTed above: http://127.0.0.1:4191/shutdown"}, els(term...)...), kill)...))},
		{name: "Istio's known by its process alone, in a container of another name: the outcome's", outcome: Failure,
			sidecars: []*sidecar{planned("c1", "pilot-agent")},
			want:     lines("c1", "SIGKILL", "SIGKILL", kill)},
		{name: "no sidecar: nothing to do", outcome: Success},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t, tt.env...)
			got := describePlan(planStop(tt.outcome, &cfg, tt.sidecars))
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("plan (-want +got):\n%s", diff)
			}
		})
	}
}

// planned is a sidecar as the stop's plan sees it: its container, its
// main process's name, what the table knows of it, its command line.
func planned(container, process string, args ...string) *sidecar {
	main := procscan.Process{PID: 100, Comm: process}
	return &sidecar{container: container, main: main, known: knownAs(container, main), args: args}
}

// describePlan reads a plan as TestStopPlan's rows do.
func describePlan(p stopPlan) []string {
	var out []string
	for _, sp := range p.sidecars {
		c := sp.sidecar.container + ": "
		action := sp.action.String()
		if sp.own {
			action += " (its own)"
		}
		out = append(out, c+action)
		for _, st := range sp.steps {
			out = append(out, c+describeStep(st, p))
		}
		for _, st := range sp.fallback {
			out = append(out, c+"else "+describeStep(st, p))
		}
		if sp.kill {
			out = append(out, c+fmt.Sprintf("SIGKILL if up %s after, given up %s after that", p.killAfter, p.giveUpAfter))
		}
	}
	return out
}

func describeStep(st step, p stopPlan) string {
	switch st.kind {
	case stepDrain:
		return "POST " + st.url.String() + ", its answer awaited"
	case stepPost:
		return "POST " + st.url.String() + " until answered"
	case stepPosted:
		return "as POSTed above: " + st.url.String()
	case stepAwaitHandler:
		return fmt.Sprintf("wait until it handles %s (within %s)", st.signal, p.handlerWait)
	case stepSignal:
		return st.signal.String()
	case stepLeave:
		return "leave it running"
	}
	return fmt.Sprintf("step %d", st.kind)
}
