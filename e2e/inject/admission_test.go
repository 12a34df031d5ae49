package inject

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	admissionregistrationv1beta1 "k8s.io/api/admissionregistration/v1beta1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apiserver/pkg/admission"
	admissionauthorizer "k8s.io/apiserver/pkg/admission/plugin/authorizer"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/policy/mutating/patch"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/apiserver/pkg/cel/environment"
	"k8s.io/utils/ptr"

	"istio.io/istio/pilot/pkg/features"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/inject/injector"
)

// The MutatingAdmissionPolicy of deploy/admission, checked without a cluster:
// its files decode strictly into the API types (v1, and the v1beta1 copy for
// Kubernetes 1.34-1.35, kept in step with it); its CEL compiles in the
// environments the API servers that serve it check new expressions against;
// and run by the API server's own code (k8s.io/apiserver's CEL compiler,
// match-condition matcher and JSON patcher, as its mutating admission
// plugin calls them: compilation.go's compilePolicy, dispatcher.go), it
// gives each pod the result the README's table says. k8sjobs proves the
// same on the cluster, with the webhooks that add the sidecars.

var updateAdmission = flag.Bool("update-admission", false, "rewrite deploy/admission/v1beta1 from deploy/admission")

const admissionDir = "admission"

// admissionFiles are deploy/admission's manifests: `kubectl apply -f
// deploy/admission/` applies these and nothing else (kubectl reads .yaml,
// .yml and .json files, not README.md, and not v1beta1/ without -R).
var admissionFiles = []string{"binding.yaml", "policy.yaml"}

// readPolicy decodes deploy/admission strictly.
func readPolicy(t *testing.T) (admissionregistrationv1.MutatingAdmissionPolicy, admissionregistrationv1.MutatingAdmissionPolicyBinding) {
	t.Helper()
	var p admissionregistrationv1.MutatingAdmissionPolicy
	var b admissionregistrationv1.MutatingAdmissionPolicyBinding
	decodeStrict(t, readDeploy(t, filepath.Join(admissionDir, "policy.yaml")), &p)
	decodeStrict(t, readDeploy(t, filepath.Join(admissionDir, "binding.yaml")), &b)
	return p, b
}

// TestAdmissionFiles: the directory holds exactly the policy and its
// binding, each of its kind and API version, the binding naming the policy.
func TestAdmissionFiles(t *testing.T) {
	entries, err := os.ReadDir(filepath.Join(deployDir, admissionDir))
	if err != nil {
		t.Fatal(err)
	}
	var manifests []string
	for _, e := range entries {
		if ext := filepath.Ext(e.Name()); !e.IsDir() && (ext == ".yaml" || ext == ".yml" || ext == ".json") {
			manifests = append(manifests, e.Name())
		}
	}
	if diff := cmp.Diff(admissionFiles, manifests); diff != "" {
		t.Errorf("deploy/admission's manifests (-want +got):\n%s", diff)
	}
	p, b := readPolicy(t)
	for _, tm := range []metav1.TypeMeta{p.TypeMeta, b.TypeMeta} {
		if tm.APIVersion != "admissionregistration.k8s.io/v1" {
			t.Errorf("%s is %s, want admissionregistration.k8s.io/v1 (GA from 1.36)", tm.Kind, tm.APIVersion)
		}
	}
	if p.Kind != "MutatingAdmissionPolicy" || b.Kind != "MutatingAdmissionPolicyBinding" {
		t.Errorf("kinds %s and %s", p.Kind, b.Kind)
	}
	if b.Spec.PolicyName != p.Name {
		t.Errorf("the binding names policy %q, the policy is %q", b.Spec.PolicyName, p.Name)
	}
	if b.Spec.ParamRef != nil || p.Spec.ParamKind != nil {
		t.Error("the policy takes no parameters: a missing parameter object would be a failure of its own")
	}
	// The choices the README explains.
	if fp := p.Spec.FailurePolicy; fp == nil || *fp != admissionregistrationv1.Ignore {
		t.Errorf("failurePolicy %v, want Ignore: a pod the policy cannot read is admitted as it came", fp)
	}
	if p.Spec.ReinvocationPolicy != admissionregistrationv1.IfNeededReinvocationPolicy {
		t.Errorf("reinvocationPolicy %q, want IfNeeded: it must see the sidecars webhooks add after its first run", p.Spec.ReinvocationPolicy)
	}
	if n := len(p.Spec.Mutations); n != 1 {
		t.Errorf("%d mutations, want 1: an error in a later one would leave the earlier ones applied", n)
	}
}

// TestAdmissionV1beta1InSync: deploy/admission/v1beta1 is deploy/admission
// with the API version Kubernetes 1.34 and 1.35 serve (behind the
// MutatingAdmissionPolicy feature gate), and decodes strictly into those
// types. Regenerate it with -update-admission.
func TestAdmissionV1beta1InSync(t *testing.T) {
	for _, f := range admissionFiles {
		want := v1beta1Of(t, f, readDeploy(t, filepath.Join(admissionDir, f)))
		got := checkGenerated(t, filepath.Join(admissionDir, "v1beta1", f), want, *updateAdmission,
			"go test ./inject -run TestAdmissionV1beta1InSync -update-admission")
		switch f {
		case "policy.yaml":
			var p admissionregistrationv1beta1.MutatingAdmissionPolicy
			decodeStrict(t, got, &p)
		case "binding.yaml":
			var b admissionregistrationv1beta1.MutatingAdmissionPolicyBinding
			decodeStrict(t, got, &b)
		}
	}
}

// v1beta1Of turns a deploy/admission file into its v1beta1 copy: a header
// saying so, and the API version. Nothing else differs between the two
// versions' types (k8s.io/api admissionregistration/v1beta1 and v1).
func v1beta1Of(t *testing.T, name string, v1 []byte) []byte {
	t.Helper()
	const from, to = "apiVersion: admissionregistration.k8s.io/v1\n", "apiVersion: admissionregistration.k8s.io/v1beta1\n"
	if bytes.Count(v1, []byte(from)) != 1 {
		t.Fatalf("want exactly one %q line", strings.TrimSpace(from))
	}
	header := "# GENERATED from ../" + name + " by (cd e2e && go test ./inject -run TestAdmissionV1beta1InSync\n" +
		"# -update-admission): edit that file, not this one. For Kubernetes 1.34 and\n" +
		"# 1.35, where the API server serves MutatingAdmissionPolicy as v1beta1 once\n" +
		"# started with --feature-gates=MutatingAdmissionPolicy=true and\n" +
		"# --runtime-config=admissionregistration.k8s.io/v1beta1=true (../README.md).\n"
	return append([]byte(header), bytes.Replace(v1, []byte(from), []byte(to), 1)...)
}

// TestAdmissionKnowsSidecars: the policy's list of known sidecars is the
// supervisor's default SUPERVISOR_SIDECARS (the product's own test holds
// that default to supervisor/sidecars.go) and the injection template's.
func TestAdmissionKnowsSidecars(t *testing.T) {
	p, _ := readPolicy(t)
	known, ok := compilePolicy(t, p, environment.DefaultCompatibilityVersion(), environment.StoredExpressions).variables["known"]
	if !ok {
		t.Fatal("the policy has no variable known")
	}
	out, _, err := known.Program.Eval(map[string]any{})
	if err != nil {
		t.Fatalf("variable known: %v", err)
	}
	got, err := out.ConvertToNative(reflect.TypeFor[[]string]())
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"istio-proxy", "linkerd-proxy", "daprd", "consul-dataplane", "vault-agent", "cloud-sql-proxy", "otc-container", "otel-collector", "fluent-bit"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the policy's known sidecars (-want +got):\n%s", diff)
	}
	if tmpl := string(readDeploy(t, templateFile)); !strings.Contains(tmpl, `"`+strings.Join(want, ",")+`"`) {
		t.Errorf("the injection template's default sidecars are not %s", strings.Join(want, ","))
	}
}

// compatibilityVersions are the CEL environments new expressions are
// checked against (environment.DefaultCompatibilityVersion: one minor
// below the API server's own): 1.34's and 1.35's (v1beta1), 1.36's and
// 1.37's (v1).
var compatibilityVersions = []string{"1.33", "1.34", "1.35", "1.36"}

// compiledPolicy is the policy as the API server's plugin compiles it
// (compilePolicy in k8s.io/apiserver's policy/mutating/compilation.go).
type compiledPolicy struct {
	compiler *plugincel.CompositedCompiler
	// variables: each variable compiled, by name.
	variables map[string]plugincel.CompilationResult
	matcher   matchconditions.Matcher
	patcher   patch.Patcher
}

// compilePolicy compiles p as the API server's validation does when it is
// written (NewExpressions: the environment of the compatibility version)
// or as its plugin does when it runs (StoredExpressions), and fails the
// test on any compilation error.
func compilePolicy(t *testing.T, p admissionregistrationv1.MutatingAdmissionPolicy, compat *version.Version, mode environment.Type) compiledPolicy {
	t.Helper()
	compiler, err := plugincel.NewCompositedCompiler(environment.MustBaseEnvSet(compat))
	if err != nil {
		t.Fatal(err)
	}
	opts := plugincel.OptionalVariableDeclarations{HasParams: p.Spec.ParamKind != nil, HasAuthorizer: true}
	c := compiledPolicy{compiler: compiler, variables: map[string]plugincel.CompilationResult{}}
	for _, v := range p.Spec.Variables {
		r := compiler.CompileAndStoreVariable(&validating.Variable{Name: v.Name, Expression: v.Expression}, opts, mode)
		if r.Error != nil {
			t.Errorf("CEL %s: variable %s: %v", compat, v.Name, r.Error)
		}
		c.variables[v.Name] = r
	}
	var conds []plugincel.ExpressionAccessor
	for i := range p.Spec.MatchConditions {
		conds = append(conds, (*matchconditions.MatchCondition)(&p.Spec.MatchConditions[i]))
	}
	cond := compiler.CompileCondition(conds, opts, mode)
	for _, err := range cond.CompilationErrors() {
		t.Errorf("CEL %s: match conditions: %v", compat, err)
	}
	c.matcher = matchconditions.NewMatcher(cond, p.Spec.FailurePolicy, "policy", "validate", p.Name)
	popts := opts
	popts.HasPatchTypes = true
	for i, m := range p.Spec.Mutations {
		if m.PatchType != admissionregistrationv1.PatchTypeJSONPatch || m.JSONPatch == nil {
			t.Fatalf("mutation %d is %s, the tests run JSONPatch", i, m.PatchType)
		}
		ev := compiler.CompileMutatingEvaluator(&patch.JSONPatchCondition{Expression: m.JSONPatch.Expression}, popts, mode)
		for _, err := range ev.CompilationErrors() {
			t.Errorf("CEL %s: mutation %d: %v", compat, i, err)
		}
		c.patcher = patch.NewJSONPatcher(ev)
	}
	if t.Failed() {
		t.FailNow()
	}
	return c
}

// TestAdmissionCompiles: every expression compiles in the CEL environment
// of each API server that serves the policy, as its validation compiles
// them when the policy is written (k8s.io/kubernetes
// pkg/apis/admissionregistration/validation: NewExpressions).
func TestAdmissionCompiles(t *testing.T) {
	p, _ := readPolicy(t)
	for _, v := range compatibilityVersions {
		t.Run(v, func(t *testing.T) {
			compilePolicy(t, p, version.MustParse(v), environment.NewExpressions)
		})
	}
}

// policyRun is one run of the policy on a pod, as the API server's
// dispatcher makes it.
type policyRun struct {
	// invoked: the selectors and the match conditions let the policy run
	// (only then may it run again after the webhooks).
	invoked bool
	pod     *corev1.Pod
	err     error
}

// run applies the policy to pod in ns the way the API server's mutating
// admission policy plugin does: the binding's and the policy's selectors,
// the match conditions, then the one mutation (the object after it decoded
// strictly into a Pod); an error other than an API status is the
// failurePolicy's to judge (Ignore: the pod as it came).
func (c compiledPolicy) run(t *testing.T, p admissionregistrationv1.MutatingAdmissionPolicy, b admissionregistrationv1.MutatingAdmissionPolicyBinding, ns *corev1.Namespace, pod *corev1.Pod) policyRun {
	t.Helper()
	for _, mr := range []*admissionregistrationv1.MatchResources{p.Spec.MatchConstraints, b.Spec.MatchResources} {
		if mr == nil {
			continue
		}
		if !selects(t, mr.NamespaceSelector, ns.Labels) || !selects(t, mr.ObjectSelector, pod.Labels) {
			return policyRun{pod: pod}
		}
	}
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	gvk := corev1.SchemeGroupVersion.WithKind("Pod")
	gvr := corev1.SchemeGroupVersion.WithResource("pods")
	in := pod.DeepCopy()
	attrs := admission.NewAttributesRecord(in, nil, gvk, ns.Name, in.Name, gvr, "", admission.Create, &metav1.CreateOptions{}, false, &user.DefaultInfo{Name: "system:serviceaccount:kube-system:job-controller"})
	va := &admission.VersionedAttributes{Attributes: attrs, VersionedKind: gvk, VersionedObject: admission.NewLazyObject(in)}
	authz := admissionauthorizer.NewCachingAuthorizer(authorizerfactory.NewAlwaysAllowAuthorizer())
	ctx := c.compiler.CreateContext(context.Background())
	if c.matcher != nil {
		m := c.matcher.Match(ctx, va, nil, authz)
		if m.Error != nil {
			return policyRun{pod: pod, err: m.Error}
		}
		if !m.Matches {
			return policyRun{pod: pod}
		}
	}
	out, err := c.patcher.Patch(ctx, patch.Request{
		MatchedResource:     gvr,
		VersionedAttributes: va,
		ObjectInterfaces:    admission.NewObjectInterfacesFromScheme(scheme),
		OptionalVariables:   plugincel.OptionalVariableBindings{Authorizer: authz},
		Namespace:           ns,
	}, celconfig.RuntimeCELCostBudget)
	if err != nil {
		// An API status error denies the pod whatever the failurePolicy
		// (dispatcher.go returns it as it is): the policy must never make
		// one.
		var status apierrors.APIStatus
		if errors.As(err, &status) {
			t.Fatalf("the policy's patch made an API error, which denies the pod even under failurePolicy Ignore: %v", err)
		}
		return policyRun{invoked: true, pod: pod, err: err}
	}
	return policyRun{invoked: true, pod: out.(*corev1.Pod)}
}

func selects(t *testing.T, sel *metav1.LabelSelector, l map[string]string) bool {
	t.Helper()
	if sel == nil {
		return true
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Fatal(err)
	}
	return s.Matches(labels.Set(l))
}

// admitted is what the API server makes of a pod: the policy, then the
// webhooks (webhook, which may be nil), then the policy again if it ran
// the first time and the webhooks changed the pod (reinvocationPolicy
// IfNeeded: dispatcher.go, reinvocationcontext.go). It returns the final
// pod and the error of the last run (nil when none).
func (c compiledPolicy) admitted(t *testing.T, p admissionregistrationv1.MutatingAdmissionPolicy, b admissionregistrationv1.MutatingAdmissionPolicyBinding, ns *corev1.Namespace, pod *corev1.Pod, webhook func(*testing.T, *corev1.Pod)) (*corev1.Pod, error) {
	t.Helper()
	first := c.run(t, p, b, ns, pod)
	if webhook == nil {
		return first.pod, first.err
	}
	hooked := first.pod.DeepCopy()
	webhook(t, hooked)
	if !first.invoked || equalJSON(t, hooked, first.pod) {
		return hooked, first.err
	}
	second := c.run(t, p, b, ns, hooked)
	return second.pod, second.err
}

func equalJSON(t *testing.T, a, b any) bool {
	t.Helper()
	ja, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	jb, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Equal(ja, jb)
}

// jobPod is a pod as the Job controller creates it: owned by its Job, the
// restart policy and containers of its template.
func jobPod(restart corev1.RestartPolicy, containers ...corev1.Container) *corev1.Pod {
	return &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			Name: "work-x7k2p", Namespace: "jobs",
			Labels: map[string]string{"batch.kubernetes.io/job-name": "work", "job-name": "work"},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "batch/v1", Kind: "Job", Name: "work", UID: "3c4a7a8e-0d9e-4f43-9a9e-5a6f0b0e9d41",
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Spec: corev1.PodSpec{RestartPolicy: restart, Containers: containers},
	}
}

// ctr is a container as the API server has defaulted it.
func ctr(name string) corev1.Container {
	return corev1.Container{Name: name, Image: "busybox:1.37", ImagePullPolicy: corev1.PullIfNotPresent,
		TerminationMessagePath: "/dev/termination-log", TerminationMessagePolicy: corev1.TerminationMessageReadFile}
}

// withPod edits a copy of pod.
func withPod(pod *corev1.Pod, edit func(*corev1.Pod)) *corev1.Pod {
	p := pod.DeepCopy()
	edit(p)
	return p
}

// annotated is a copy of pod with these annotations (name, value...) too.
func annotated(pod *corev1.Pod, kv ...string) *corev1.Pod {
	return withPod(pod, func(p *corev1.Pod) { p.Annotations = setPairs(p.Annotations, kv...) })
}

// labelled is a copy of pod with these labels (name, value...) too.
func labelled(pod *corev1.Pod, kv ...string) *corev1.Pod {
	return withPod(pod, func(p *corev1.Pod) { p.Labels = setPairs(p.Labels, kv...) })
}

// appending is a webhook that appends containers, as Dapr's, vault-k8s's
// and (before its reordering) Istio's injectors do.
func appending(cs ...corev1.Container) func(*testing.T, *corev1.Pod) {
	return func(_ *testing.T, p *corev1.Pod) { p.Spec.Containers = append(p.Spec.Containers, cs...) }
}

// policyEnv is the supervisor's environment the policy gives for these
// pairs, with what it always sets.
func policyEnv(restart string, kv ...string) map[string]string {
	return setPairs(map[string]string{"SUPERVISOR_RESTART_POLICY": restart, "GOMEMLIMIT": "resourceFieldRef:limits.memory",
		stateVar: "/var/run/sidecar-supervisor-state"}, kv...)
}

// appEnv is policyEnv for a Never pod of one app "app" whose sidecars
// after it are after (SUPERVISOR_AFTER_APPS), and these further pairs.
func appEnv(after string, kv ...string) map[string]string {
	return policyEnv("Never", append([]string{"SUPERVISOR_APP_CONTAINERS", "1", "SUPERVISOR_APPS", "app", afterAppsVar, after}, kv...)...)
}

type admissionCase struct {
	name string
	pod  *corev1.Pod
	// nsLabels label the pod's namespace.
	nsLabels map[string]string
	// webhook changes the pod after the policy's first run (a sidecar
	// injector); nil for none.
	webhook func(*testing.T, *corev1.Pod)
	// untouched: the policy leaves the pod (after the webhook) exactly as
	// it came, byte for byte. Else want is its shape.
	untouched bool
	want      podShape
	ptrace    bool
	// annotations the pod must carry after admission (others may be there).
	annotations map[string]string
	// failure: the policy cannot read the pod, with an error saying this;
	// the pod must come out untouched.
	failure string
	// meant says why the pod without the policy is not the case meant, ""
	// when it is.
	meant func(*corev1.Pod) string
}

func admissionCases(t *testing.T) []admissionCase {
	app := ctr("app")
	daprd := ctr("daprd")
	daprd.Args = []string{"--mode", "kubernetes", "--dapr-http-port", "3500", "--app-id", "work"}
	vault := ctr("vault-agent")
	vault.Command, vault.Args = []string{"/bin/sh", "-ec"}, []string{"echo ${VAULT_CONFIG?} | base64 -d > /home/vault/config.json && vault agent -config=/home/vault/config.json"}
	csql := ctr("cloud-sql-proxy")
	csql.Args = []string{"--quitquitquit", "--admin-port=9091", "p:r:i"}
	proxy := ctr(proxyName)
	proxy.SecurityContext = &corev1.SecurityContext{RunAsUser: ptr.To[int64](1337)}
	otherProxy := ctr(proxyName)
	otherProxy.SecurityContext = &corev1.SecurityContext{RunAsUser: ptr.To[int64](1500), RunAsGroup: ptr.To[int64](1500)}
	rootProxy := ctr(proxyName)
	rootProxy.SecurityContext = &corev1.SecurityContext{RunAsUser: ptr.To[int64](0)}
	nativeProxy := ctr(proxyName)
	nativeProxy.RestartPolicy = ptr.To(corev1.ContainerRestartPolicyAlways)
	nativeLinkerd := ctr("linkerd-proxy")
	nativeLinkerd.RestartPolicy = ptr.To(corev1.ContainerRestartPolicyAlways)
	load := ctr("load")
	load.ImagePullPolicy = corev1.PullAlways

	never := jobPod(corev1.RestartPolicyNever, app)
	const (
		statusKey   = annotationPrefix + "status"
		hostPIDWhy  = "not added: a hostPID pod cannot share its process namespace (the API server refuses a pod with both); stop the sidecars from the app, or use native sidecars"
		unsharedWhy = "not added: the pod sets shareProcessNamespace: false, which the supervisor needs true; stop the sidecars from the app, or use native sidecars"
		windowsWhy  = "not added: a Windows pod; the supervisor and the shared process namespace it needs are Linux only"
		vaultInject = "vault.hashicorp.com/agent-inject"
		vaultQuit   = "vault.hashicorp.com/agent-enable-quit"
		vaultStatus = "vault.hashicorp.com/agent-inject-status"
	)
	vaultPod := annotated(never, vaultInject, "true", "vault.hashicorp.com/role", "work")
	vaultHook := func(_ *testing.T, p *corev1.Pod) {
		p.Annotations[vaultStatus] = "injected"
		p.Spec.InitContainers = append(p.Spec.InitContainers, ctr("vault-agent-init"))
		p.Spec.Containers = append(p.Spec.Containers, vault)
	}

	// Istio's own injector (istiod's webhook, Istio's charts rendered with
	// our values), as on a cluster where both are installed, in a mesh
	// whose pilot-agents serve their status port on 15099: the ProxyConfig
	// istiod hands istio-proxy says so.
	in, err := injector.RenderHelm(map[string]any{
		"meshConfig": map[string]any{"defaultConfig": map[string]any{"statusPort": 15099}},
		"global":     map[string]any{"proxy": map[string]any{"statusPort": 15099}},
	})
	if err != nil {
		t.Fatal(err)
	}
	hook := newWebhook(t, in)
	istio := func(t *testing.T, p *corev1.Pod) { *p = *admit(t, hook, p) }
	istioPod := labelled(never, "sidecar.istio.io/inject", "true")
	const quit15099 = "http://127.0.0.1:15099/quitquitquit"

	return []admissionCase{
		// Sidecars a webhook adds after the policy's first run: seen on the
		// second.
		{name: "Dapr's daprd from its webhook", pod: never, webhook: appending(daprd),
			want: supervisorFirst(appEnv("daprd"), "app", "daprd")},
		{name: "the Vault agent from vault-k8s: its quit turned on first", pod: vaultPod, webhook: vaultHook,
			want: withInits(supervisorFirst(appEnv("vault-agent"), "app", "vault-agent"), "vault-agent-init"), annotations: map[string]string{vaultQuit: "true", vaultStatus: "injected"}},
		{name: "the Vault agent on its own listener port", pod: annotated(vaultPod, "vault.hashicorp.com/agent-cache-listener-port", "8300"), webhook: vaultHook,
			want:        withInits(supervisorFirst(appEnv("vault-agent", "SUPERVISOR_SIDECAR_ACTIONS", "vault-agent=http://127.0.0.1:8300/agent/v1/quit"), "app", "vault-agent"), "vault-agent-init"),
			annotations: map[string]string{vaultQuit: "true"}},
		{name: "the Vault agent with its quit turned off by the pod: left so", pod: annotated(vaultPod, vaultQuit, "false"), webhook: vaultHook,
			want: withInits(supervisorFirst(appEnv("vault-agent"), "app", "vault-agent"), "vault-agent-init"), annotations: map[string]string{vaultQuit: "false"}},
		{name: "Vault init-time secrets only: no sidecar, nothing", pod: annotated(vaultPod, "vault.hashicorp.com/agent-pre-populate-only", "true"), untouched: true},
		// Sidecars in the pod spec itself: the first run adds the supervisor.
		{name: "cloud-sql-proxy by hand, after the app", pod: jobPod(corev1.RestartPolicyNever, app, csql),
			want: supervisorFirst(appEnv("cloud-sql-proxy"), "app", "cloud-sql-proxy")},
		{name: "cloud-sql-proxy by hand, before the app: the supervisor last", pod: jobPod(corev1.RestartPolicyOnFailure, csql, app),
			want: supervisorLast(policyEnv("OnFailure", "SUPERVISOR_APP_CONTAINERS", "1", "SUPERVISOR_APPS", "app"), "cloud-sql-proxy", "app")},
		// A standby: the supervisor twice, first or last (checkStandby).
		{name: "standby, daprd from its webhook: both first", pod: annotated(never, standbyAnnotation, "true"), webhook: appending(daprd),
			want: withStandby(supervisorFirst(appEnv("daprd"), "app", "daprd"))},
		{name: "standby, cloud-sql-proxy before the app: both last", pod: annotated(jobPod(corev1.RestartPolicyOnFailure, csql, app), standbyAnnotation, "true"),
			want: withStandby(supervisorLast(policyEnv("OnFailure", "SUPERVISOR_APP_CONTAINERS", "1", "SUPERVISOR_APPS", "app"), "cloud-sql-proxy", "app"))},
		{name: "cloud-sql-proxy by hand, then Istio's injector: one supervisor", pod: jobPod(corev1.RestartPolicyNever, app, csql), webhook: appending(proxy),
			want: supervisorFirst(appEnv("cloud-sql-proxy"), "app", "cloud-sql-proxy", proxyName)},
		// Istio's own sidecar template alone (no supervisor template).
		{name: "istio-proxy: pilot-agent's quit on success", pod: never, webhook: appending(proxy),
			want: supervisorFirst(appEnv(proxyName, "SUPERVISOR_ON_SUCCESS", quitURL), "app", proxyName)},
		{name: "istio-proxy on another status port", pod: annotated(never, "status.sidecar.istio.io/port", "15099"), webhook: appending(proxy),
			want: supervisorFirst(appEnv(proxyName, "SUPERVISOR_ON_SUCCESS", "http://127.0.0.1:15099/quitquitquit"), "app", proxyName)},
		{name: "istio-proxy as root: every outcome quits", pod: never, webhook: appending(rootProxy),
			want: supervisorFirst(appEnv(proxyName, "SUPERVISOR_ON_SUCCESS", quitURL, "SUPERVISOR_ON_FAILURE", quitURL, "SUPERVISOR_ON_UNKNOWN", quitURL), "app", proxyName)},
		{name: "istio-proxy of another uid: the supervisor's too", pod: never, webhook: appending(otherProxy),
			want: podShape{Containers: []string{supervisorName, "app", proxyName}, ShareProcessNamespace: true, SupervisorUser: "1500",
				SupervisorEnv: appEnv(proxyName, "SUPERVISOR_ON_SUCCESS", quitURL)}},
		{name: "istio-proxy first (holdApplicationUntilProxyStarts): the supervisor last", pod: never,
			webhook: func(_ *testing.T, p *corev1.Pod) {
				p.Spec.Containers = append([]corev1.Container{proxy}, p.Spec.Containers...)
			},
			want: supervisorLast(policyEnv("Never", "SUPERVISOR_APP_CONTAINERS", "1", "SUPERVISOR_APPS", "app", "SUPERVISOR_ON_SUCCESS", quitURL), proxyName, "app")},
		{name: "a pod Istio will inject, with cloud-sql-proxy: the quit ready for istio-proxy", pod: labelled(jobPod(corev1.RestartPolicyNever, app, csql), "sidecar.istio.io/inject", "true"),
			want: supervisorFirst(appEnv("cloud-sql-proxy", "SUPERVISOR_ON_SUCCESS", quitURL), "app", "cloud-sql-proxy")},
		{name: "a namespace Istio injects", pod: jobPod(corev1.RestartPolicyNever, app, csql), nsLabels: map[string]string{"istio-injection": "enabled"},
			want: supervisorFirst(appEnv("cloud-sql-proxy", "SUPERVISOR_ON_SUCCESS", quitURL), "app", "cloud-sql-proxy")},
		{name: "Istio's injector, its sidecar template alone", pod: annotated(istioPod, "inject.istio.io/templates", "sidecar"), webhook: istio,
			want: withInits(supervisorFirst(appEnv(proxyName, "SUPERVISOR_ON_SUCCESS", quit15099), "app", proxyName), "istio-init")},
		{name: "Istio's injector with the supervisor template: its supervisor, not a second", pod: istioPod, webhook: istio, untouched: true,
			meant: func(p *corev1.Pod) string {
				if env := shapeOf(p.Spec).SupervisorEnv; env["SUPERVISOR_ON_SUCCESS"] != quit15099 {
					return fmt.Sprintf("no supervisor from the template, or not its settings: %v", env)
				}
				return ""
			}},
		{name: "Istio's injector, istio-proxy native: nothing", pod: annotated(istioPod, "inject.istio.io/templates", "sidecar", "sidecar.istio.io/nativeSidecar", "true"),
			webhook: istio, untouched: true, meant: func(p *corev1.Pod) string {
				if findInit(p.Spec, proxyName) == nil {
					return "Istio did not make istio-proxy a native sidecar"
				}
				return ""
			}},
		// Several apps, OnFailure, an image pulled on every start.
		{name: "two apps under OnFailure, one pulled on every start", pod: jobPod(corev1.RestartPolicyOnFailure, app, load), webhook: appending(daprd),
			want: supervisorFirst(policyEnv("OnFailure", "SUPERVISOR_APP_CONTAINERS", "2", "SUPERVISOR_APPS", "app,load", afterAppsVar, "daprd", "SUPERVISOR_RESTART_MARGIN", "60s"), "app", "load", "daprd")},
		// Native sidecars are the kubelet's.
		{name: "istio-proxy native: nothing", pod: never, webhook: func(_ *testing.T, p *corev1.Pod) { p.Spec.InitContainers = append(p.Spec.InitContainers, nativeProxy) }, untouched: true},
		{name: "a native linkerd-proxy next to daprd: not among the sidecars to stop", pod: withPod(never, func(p *corev1.Pod) { p.Spec.InitContainers = []corev1.Container{nativeLinkerd} }),
			webhook: appending(daprd),
			want:    withInits(supervisorFirst(appEnv("daprd", "SUPERVISOR_SIDECARS", "istio-proxy,daprd,consul-dataplane,vault-agent,cloud-sql-proxy,otc-container,otel-collector,fluent-bit"), "app", "daprd"), "linkerd-proxy")},
		// Never twice.
		{name: "a supervisor by hand: nothing", pod: jobPod(corev1.RestartPolicyNever, app, csql, ctr(supervisorName)), untouched: true},
		{name: "an init container named sidecar-supervisor: nothing", pod: withPod(jobPod(corev1.RestartPolicyNever, app, csql), func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{ctr(supervisorName)}
		}), untouched: true},
		// Pods it cannot serve: why, in an annotation.
		{name: "hostPID: the reason only", pod: withPod(never, func(p *corev1.Pod) { p.Spec.HostPID = true }), webhook: appending(daprd),
			want: podShape{Containers: []string{"app", "daprd"}}, annotations: map[string]string{statusKey: hostPIDWhy}},
		{name: "shareProcessNamespace false: the reason only", pod: annotated(withPod(never, func(p *corev1.Pod) { p.Spec.ShareProcessNamespace = ptr.To(false) }), "team", "a"),
			webhook: appending(daprd),
			want:    podShape{Containers: []string{"app", "daprd"}}, annotations: map[string]string{statusKey: unsharedWhy, "team": "a"}},
		{name: "a Windows pod: the reason only", pod: withPod(never, func(p *corev1.Pod) { p.Spec.OS = &corev1.PodOS{Name: corev1.Windows} }), webhook: appending(daprd),
			want: podShape{Containers: []string{"app", "daprd"}}, annotations: map[string]string{statusKey: windowsWhy}},
		{name: "a pod for Windows nodes: the reason only", pod: withPod(never, func(p *corev1.Pod) { p.Spec.NodeSelector = map[string]string{"kubernetes.io/os": "windows"} }),
			webhook: appending(daprd),
			want:    podShape{Containers: []string{"app", "daprd"}}, annotations: map[string]string{statusKey: windowsWhy}},
		{name: "hostPID with vault-k8s: not even its quit", pod: withPod(vaultPod, func(p *corev1.Pod) { p.Spec.HostPID = true }), webhook: vaultHook,
			want:        podShape{InitContainers: []string{"vault-agent-init"}, Containers: []string{"app", "vault-agent"}},
			annotations: map[string]string{statusKey: hostPIDWhy, vaultStatus: "injected"}},
		// Pods left alone, byte for byte.
		{name: "a Job pod without sidecars", pod: never, untouched: true},
		{name: "a Job pod whose webhook adds nothing it knows", pod: never, webhook: appending(ctr("log-shipper")), untouched: true},
		{name: "a bare pod with a sidecar", pod: withPod(jobPod(corev1.RestartPolicyNever, app, csql), func(p *corev1.Pod) { p.OwnerReferences = nil }), untouched: true},
		{name: "a pod of another owner with a sidecar", pod: withPod(jobPod(corev1.RestartPolicyNever, app, csql), func(p *corev1.Pod) {
			p.OwnerReferences[0].Kind, p.OwnerReferences[0].APIVersion = "Workflow", "argoproj.io/v1alpha1"
		}), untouched: true},
		{name: "restartPolicy Always, asked", pod: labelled(withPod(jobPod(corev1.RestartPolicyAlways, app, csql), func(p *corev1.Pod) { p.OwnerReferences = nil }), annotationPrefix+"inject", "true"), untouched: true},
		{name: "opted out by annotation", pod: annotated(jobPod(corev1.RestartPolicyNever, app, csql), annotationPrefix+"inject", "false"), untouched: true},
		{name: "opted out by label", pod: labelled(jobPod(corev1.RestartPolicyNever, app, csql), annotationPrefix+"inject", "false"), untouched: true},
		{name: "opted out by its namespace", pod: jobPod(corev1.RestartPolicyNever, app, csql), nsLabels: map[string]string{annotationPrefix + "inject": "false"}, untouched: true},
		// Asked for.
		{name: "a bare pod that asks, naming its sidecar", pod: annotated(labelled(withPod(jobPod(corev1.RestartPolicyNever, app, ctr("my-proxy")), func(p *corev1.Pod) { p.OwnerReferences = nil }),
			annotationPrefix+"inject", "true"), annotationPrefix+"sidecars", "my-proxy"),
			want: supervisorFirst(appEnv("my-proxy", "SUPERVISOR_SIDECARS", "my-proxy"), "app", "my-proxy")},
		{name: "every tuning annotation", pod: labelled(withPod(never, func(p *corev1.Pod) { p.Annotations = everyAnnotation() }), annotationPrefix+"inject", "true"),
			want: supervisorLast(everyAnnotationEnv(policyEnv("Never")), "app")},
		{name: "exit-status ptrace: root with SYS_PTRACE, SYS_PACCT and KILL", pod: annotated(never, annotationPrefix+"exit-status", "ptrace"), webhook: appending(daprd), ptrace: true,
			want: asRoot(supervisorFirst(appEnv("daprd", "SUPERVISOR_EXIT_STATUS", "ptrace"), "app", "daprd"))},
		{name: "exit-status accounting: root with SYS_PACCT and KILL", pod: annotated(never, annotationPrefix+"exit-status", "accounting"), webhook: appending(daprd), ptrace: true,
			want: asAccountingRoot(supervisorFirst(appEnv("daprd", "SUPERVISOR_EXIT_STATUS", "accounting"), "app", "daprd"))},
		// A pod it cannot read: past the CEL cost budget (thousands of
		// containers, which validation refuses after admission anyway).
		{name: "a pod past the CEL budget", pod: withPod(never, func(p *corev1.Pod) {
			for i := 0; i < 2000; i++ {
				p.Spec.Containers = append(p.Spec.Containers, ctr("app"), daprd)
			}
		}), failure: "cost limit exceeded", untouched: true},
	}
}

// TestAdmissionPolicy runs each case's pod through the policy as the API
// server would (at 1.37's compatibility version), its webhook between the
// two runs, and checks the result.
func TestAdmissionPolicy(t *testing.T) {
	setNativeSidecarMode(t, features.NativeSidecarModeDisabled)
	p, b := readPolicy(t)
	c := compilePolicy(t, p, environment.DefaultCompatibilityVersion(), environment.StoredExpressions)
	for _, tc := range admissionCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			// The pod's namespace as the policy sees it (namespaceObject).
			ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace, Labels: tc.nsLabels}}
			got, err := c.admitted(t, p, b, ns, tc.pod, tc.webhook)
			switch {
			case tc.failure == "" && err != nil:
				t.Fatalf("the policy failed: %v", err)
			case tc.failure != "" && (err == nil || !strings.Contains(err.Error(), tc.failure)):
				t.Fatalf("the policy's error: %v, want one saying %q", err, tc.failure)
			case err != nil:
				msg := err.Error()
				if i := strings.Index(msg, "resulted in error: "); i >= 0 {
					msg = msg[i:]
				}
				t.Logf("the policy's error, which failurePolicy Ignore passes over: %s", msg)
			}
			// What the pod would be without the policy.
			without := tc.pod.DeepCopy()
			if tc.webhook != nil {
				tc.webhook(t, without)
			}
			if tc.meant != nil {
				if why := tc.meant(without); why != "" {
					t.Fatalf("not the case meant: %s\n%s", why, dump(without))
				}
			}
			if tc.untouched {
				if diff := cmp.Diff(without, got); diff != "" || !equalJSON(t, without, got) {
					t.Errorf("the policy changed the pod (-without +with):\n%s", diff)
				}
				return
			}
			checkSupervised(t, got.Spec, tc.want, wantBasics(tc.ptrace), false, "pod", dump(got))
			for k, v := range tc.annotations {
				if got.Annotations[k] != v {
					t.Errorf("annotation %s = %q, want %q", k, got.Annotations[k], v)
				}
			}
			if _, ok := tc.annotations[annotationPrefix+"status"]; !ok && got.Annotations[annotationPrefix+"status"] != "" {
				t.Errorf("annotation %sstatus = %q, want none", annotationPrefix, got.Annotations[annotationPrefix+"status"])
			}
			// Everything else of the pod is as the webhooks left it: its
			// containers but the supervisor, in their order, and, where the
			// supervisor was added, its state volume after the pod's own
			// (checkStateDir) and shareProcessNamespace.
			w, g := without.DeepCopy(), got.DeepCopy()
			w.Annotations = got.Annotations
			if findContainer(got.Spec, supervisorName) == nil {
				if diff := cmp.Diff(w, g); diff != "" {
					t.Errorf("the policy changed more than annotations (-without +with):\n%s", diff)
				}
				return
			}
			w.Spec.ShareProcessNamespace = got.Spec.ShareProcessNamespace
			g.Spec.Containers = slices.DeleteFunc(g.Spec.Containers, func(c corev1.Container) bool { return c.Name == supervisorName || c.Name == standbyName })
			if n := len(g.Spec.Volumes); n == 0 || g.Spec.Volumes[n-1].Name != stateVolume {
				t.Errorf("the state volume is not the pod's last: %v", g.Spec.Volumes)
			} else if g.Spec.Volumes = g.Spec.Volumes[:n-1]; len(g.Spec.Volumes) == 0 {
				g.Spec.Volumes = w.Spec.Volumes // none before: nil, not empty
			}
			if diff := cmp.Diff(w, g); diff != "" {
				t.Errorf("the policy changed more than the supervisor, its state volume, shareProcessNamespace and annotations (-without +with):\n%s", diff)
			}
			// Run again, as a reinvocation would: nothing more.
			again := c.run(t, p, b, ns, got)
			if again.err != nil || !equalJSON(t, got, again.pod) {
				t.Errorf("a second run changed the pod (err %v):\n%s", again.err, cmp.Diff(got, again.pod))
			}
		})
	}
}
