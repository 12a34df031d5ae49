package inject

// The "supervisor" template on every istiod our users run, 1.20 to the
// newest. Only the newest Istio builds here (the module proxy serves no
// older istio.io/istio), so each older release is written down as the facts
// that decide how its istiod executes a template, read in Istio's public
// repository at the release's tag (github.com/istio/istio, tags 1.20.0 ...
// 1.30.0):
//
//   - the data: the fields of SidecarTemplateData, in order
//     (pkg/kube/inject/inject.go, "type SidecarTemplateData", line 98 at
//     1.20.0, 100 at 1.21.0, 102 at 1.22.0-1.26.0, 103 at 1.27.0-1.30.0).
//     A field the data lacks fails the template when reached;
//   - the functions: sprig's TxtFuncMap, then Istio's InjectionFuncmap over
//     it (inject.go parseDryTemplate: template.New("inject").Funcs(sprig.
//     TxtFuncMap()).Funcs(funcMap), line 534 at 1.20.0 ... 602 at 1.30.0;
//     template.go createInjectionFuncmap, line 40/41). sprig is v3.2.3 in
//     go.mod up to 1.23.0 and v3.3.0 from 1.24.0, which adds only sha512sum.
//     A function the map lacks fails the parse, and istiod refuses the whole
//     injector configuration;
//   - the values the templates see: the istio-sidecar-injector ConfigMap's
//     "values", which the chart picks from its own
//     (manifests/charts/istio-control/istio-discovery/templates/
//     istiod-injector-configmap.yaml, lines 14-17): global,
//     sidecarInjectorWebhook and revision always; istio_cni up to 1.23;
//     pilot.cni from 1.22; pilot.env only from 1.26; gateways from 1.23;
//   - the pod's types: k8s.io/api v0.28.3 in 1.20.0's go.mod, later ones
//     newer; the template reads no field of the pod that v0.28.3 lacks
//     (Container.RestartPolicy, which it reads of init containers, came
//     with v0.28);
//   - whether istio-proxy is native: the "sidecar" template's
//     $nativeSidecar (manifests/.../files/injection-template.yaml line 27,
//     29 from 1.27.0), three rules (nativeRule below).
//
// What did not change from 1.20.0 to the newest, and so comes from the
// newest injector in these tests: the merge of each template's output
// (applyOverlayYAML, a strategic merge patch: the same function body at
// every tag), where istio-proxy goes (webhook.go reorderPod: last, first
// with holdApplicationUntilProxyStarts from the pod's ProxyConfig or
// values.global.proxy; the same at every tag), and istio-proxy's lifecycle
// in the "sidecar" template (values.global.proxy.lifecycle when set, else
// pilot-agent wait as postStart with holdApplicationUntilProxyStarts, else
// from 1.21 a drain preStop for a native sidecar).

import (
	"bytes"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"text/template"

	"github.com/Masterminds/sprig/v3"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"istio.io/istio/pilot/pkg/features"
	"istio.io/istio/pkg/kube/inject"
)

// nativeRule is how a release's "sidecar" template decides that istio-proxy
// is a native sidecar, from the pod's sidecar.istio.io/nativeSidecar
// annotation (set or not), istiod's ENABLE_NATIVE_SIDECARS=true, and, from
// 1.27, .NativeSidecars (that setting, or "auto" and every kubelet 1.33+).
type nativeRule int

const (
	// 1.20.0-1.23.0: (eq (env "ENABLE_NATIVE_SIDECARS" "false") "true").
	nativeByEnv nativeRule = iota
	// 1.24.0-1.26.0: the annotation "true", or the setting where the pod
	// has no annotation.
	nativeByEnvOrAnnotation
	// 1.27.0 on: ne (annotation | default .NativeSidecars) "false".
	nativeByField
)

func (r nativeRule) native(annotation string, annotated, setting bool) bool {
	switch r {
	case nativeByEnv:
		return setting
	case nativeByEnvOrAnnotation:
		return (!annotated && setting) || annotation == "true"
	}
	if annotation == "" {
		return setting
	}
	return annotation != "false"
}

// istioRelease is one release's facts (see the top of this file).
type istioRelease struct {
	name string
	// fields of SidecarTemplateData, in order.
	fields []string
	// deploymentMetaObjectMeta: DeploymentMeta is a metav1.ObjectMeta (up
	// to 1.21), not a types.NamespacedName.
	deploymentMetaObjectMeta bool
	// funcs: InjectionFuncmap's names.
	funcs []string
	// sprig323: sprig v3.2.3, without sha512sum.
	sprig323 bool
	// values: the top-level keys of the injector values; pilot: the keys
	// under pilot, when values has it.
	values, pilot []string
	native        nativeRule
}

var (
	fields120 = []string{"TypeMeta", "DeploymentMeta", "ObjectMeta", "Spec", "ProxyConfig", "MeshConfig",
		"Values", "Revision", "ProxyImage", "ProxyUID", "ProxyGID"}
	fields121 = append(slices.Clone(fields120), "CompliancePolicy")
	fields122 = append(slices.Clone(fields120), "InboundTrafficPolicyMode", "CompliancePolicy")
	// NativeSidecars follows Revision.
	fields127 = slices.Insert(slices.Clone(fields122), slices.Index(fields122, "Revision")+1, "NativeSidecars")

	funcs120 = []string{"formatDuration", "isset", "excludeInboundPort", "includeInboundPorts",
		"kubevirtInterfaces", "excludeInterfaces", "applicationPorts", "annotation", "valueOrDefault",
		"toJSON", "fromJSON", "structToJSON", "protoToJSON", "toYaml", "indent", "directory", "contains",
		"toLower", "appendMultusNetwork", "env", "omit", "strdict", "toJsonMap"}
	funcs121 = append(slices.Clone(funcs120), "mergeMaps")
	funcs130 = append(slices.Clone(funcs121), "omitNil", "otelResourceAttributes")

	values120        = []string{"global", "istio_cni", "sidecarInjectorWebhook", "revision"}
	values124        = []string{"global", "sidecarInjectorWebhook", "revision", "pilot", "gateways"}
	pilotCNI, cniEnv = []string{"cni"}, []string{"cni", "env"}
)

// istioReleases: each minor's .0 tag; the patch releases of a minor change
// none of these facts.
var istioReleases = []istioRelease{
	{name: "1.20", fields: fields120, deploymentMetaObjectMeta: true, funcs: funcs120, sprig323: true, values: values120, native: nativeByEnv},
	{name: "1.21", fields: fields121, deploymentMetaObjectMeta: true, funcs: funcs121, sprig323: true, values: values120, native: nativeByEnv},
	{name: "1.22", fields: fields122, funcs: funcs121, sprig323: true, values: append(slices.Clone(values120), "pilot"), pilot: pilotCNI, native: nativeByEnv},
	{name: "1.23", fields: fields122, funcs: funcs121, sprig323: true, values: append(slices.Clone(values120), "pilot", "gateways"), pilot: pilotCNI, native: nativeByEnv},
	{name: "1.24", fields: fields122, funcs: funcs121, values: values124, pilot: pilotCNI, native: nativeByEnvOrAnnotation},
	{name: "1.25", fields: fields122, funcs: funcs121, values: values124, pilot: pilotCNI, native: nativeByEnvOrAnnotation},
	{name: "1.26", fields: fields122, funcs: funcs121, values: values124, pilot: cniEnv, native: nativeByEnvOrAnnotation},
	{name: "1.27", fields: fields127, funcs: funcs121, values: values124, pilot: cniEnv, native: nativeByField},
	{name: "1.28", fields: fields127, funcs: funcs121, values: values124, pilot: cniEnv, native: nativeByField},
	{name: "1.29", fields: fields127, funcs: funcs121, values: values124, pilot: cniEnv, native: nativeByField},
	{name: "1.30", fields: fields127, funcs: funcs130, values: values124, pilot: cniEnv, native: nativeByField},
	// The newest: the istio.io/istio module of e2e/go.mod (the 1.31 line),
	// checked against the module itself by TestNewestReleaseFacts.
	{name: "newest", fields: slices.Insert(slices.Clone(fields127), slices.Index(fields127, "ProxyImage")+1, "ProxyInitImage"),
		funcs: funcs130, values: values124, pilot: cniEnv, native: nativeByField},
}

// TestNewestReleaseFacts ties the table to the one release built here: the
// newest's fields and functions are exactly the module's.
func TestNewestReleaseFacts(t *testing.T) {
	newest := istioReleases[len(istioReleases)-1]
	var fields []string
	typ := reflect.TypeFor[inject.SidecarTemplateData]()
	for i := range typ.NumField() {
		fields = append(fields, typ.Field(i).Name)
	}
	if diff := cmp.Diff(newest.fields, fields); diff != "" {
		t.Errorf("SidecarTemplateData fields (-table +module):\n%s", diff)
	}
	funcs := slices.Sorted(maps.Keys(inject.InjectionFuncmap))
	if diff := cmp.Diff(slices.Sorted(slices.Values(newest.funcs)), funcs); diff != "" {
		t.Errorf("InjectionFuncmap (-table +module):\n%s", diff)
	}
	if _, ok := sprig.TxtFuncMap()["sha512sum"]; !ok {
		t.Error("sprig has no sha512sum: the table's sprig 3.2.3 is no longer the module's minus sha512sum")
	}
}

// funcMap is the release's functions: sprig's, then Istio's over them.
// Istio's come from the newest module (the release's own names; the
// functions our template calls behave alike at every tag).
func (r istioRelease) funcMap(t *testing.T) template.FuncMap {
	fm := sprig.TxtFuncMap()
	if r.sprig323 {
		delete(fm, "sha512sum")
	}
	for _, name := range r.funcs {
		f, ok := inject.InjectionFuncmap[name]
		if !ok {
			t.Fatalf("%s: function %q is not in the newest InjectionFuncmap", r.name, name)
		}
		fm[name] = f
	}
	return fm
}

// data is d as the release's istiod builds it: a struct of exactly its
// fields (a new type: a field it lacks is an execution error, as there),
// passed by pointer as runTemplate does, with its injector values; extra
// fields, zero, come first.
func (r istioRelease) data(d inject.SidecarTemplateData, extra ...reflect.StructField) any {
	src := reflect.ValueOf(d)
	fields := slices.Clone(extra)
	for _, name := range r.fields {
		f, ok := src.Type().FieldByName(name)
		if !ok {
			panic("no field " + name + " in the newest SidecarTemplateData")
		}
		if name == "DeploymentMeta" && r.deploymentMetaObjectMeta {
			f.Type = reflect.TypeFor[metav1.ObjectMeta]()
		}
		fields = append(fields, reflect.StructField{Name: name, Type: f.Type})
	}
	out := reflect.New(reflect.StructOf(fields))
	for _, name := range r.fields {
		dst := out.Elem().FieldByName(name)
		switch name {
		case "DeploymentMeta":
			if r.deploymentMetaObjectMeta {
				dst.Set(reflect.ValueOf(metav1.ObjectMeta{Name: d.DeploymentMeta.Name, Namespace: d.DeploymentMeta.Namespace}))
				continue
			}
		case "Values":
			dst.Set(reflect.ValueOf(r.injectorValues(d.Values)))
			continue
		}
		dst.Set(src.FieldByName(name))
	}
	return out.Interface()
}

// injectorValues is what the release's chart passes of the newest values:
// its keys only, and istio_cni with its chart default where it has one.
func (r istioRelease) injectorValues(newest map[string]any) map[string]any {
	out := map[string]any{}
	for _, k := range r.values {
		switch k {
		case "istio_cni":
			out[k] = map[string]any{"enabled": false, "chained": true}
		case "pilot":
			pilot, _ := newest["pilot"].(map[string]any)
			picked := map[string]any{}
			for _, pk := range r.pilot {
				if v, ok := pilot[pk]; ok {
					picked[pk] = v
				}
			}
			out[k] = picked
		default:
			if v, ok := newest[k]; ok {
				out[k] = v
			}
		}
	}
	return out
}

// render executes our template as the release's istiod does, on data as
// r.data builds it.
func (r istioRelease) render(t *testing.T, data any) (string, error) {
	t.Helper()
	tmpl, err := template.New("inject").Funcs(r.funcMap(t)).Parse(string(readDeploy(t, templateFile)))
	if err != nil {
		return "", err
	}
	var out bytes.Buffer
	err = tmpl.Execute(&out, data)
	return out.String(), err
}

// annotationIgnored: the shapes of the cases whose pods 1.20-1.23 make
// otherwise, since their "sidecar" template ignores the pod's
// sidecar.istio.io/nativeSidecar: istio-proxy stays classic despite "true"
// (the supervisor, in the shape the pod asks for, or the hold, is then
// added), and native despite "false" under ENABLE_NATIVE_SIDECARS=true.
func annotationIgnored() map[string]podShape {
	return map[string]podShape{
		"native sidecar by pod annotation":                                      containerSupervised(),
		"native sidecars mesh-wide, pod opts out: the supervisor native":        native("app"),
		"native sidecars mesh-wide, pod opts out, shape container: a container": native("app"),
		"shape native, istio-proxy native too: nothing":                         nativeSupervised(nil, nativeEnv("Never", "app"), "app"),
		"native sidecar by pod annotation: no hold, Istio's drain hook kept": withHold(
			[]string{installName, "istio-init"}, []string{"web", proxyName}, wantHold("20s")),
		"native sidecars mesh-wide, pod opts out: hold": native("web"),
	}
}

// TestIstioReleases executes the template as every release from 1.20 would,
// for every pod of TestIstioInjection: it renders, gives what the newest
// release gives for the same native decision, and the pod merged from it is
// the one wanted. On today's template before this test, 1.20-1.26 failed
// every pod: "can't evaluate field NativeSidecars".
func TestIstioReleases(t *testing.T) {
	type relCase struct {
		injectCase
		in istioInstall
		// env is istiod's environment (pilot.env) for the case.
		env map[string]string
	}
	var cases []relCase
	for _, tc := range allCases(t) {
		env := map[string]string{}
		pilot, _ := tc.values["pilot"].(map[string]any)
		e, _ := pilot["env"].(map[string]any)
		for k, v := range e {
			env[k] = v.(string)
		}
		cases = append(cases, relCase{injectCase: tc, in: *tc.install(t, installs(t)[0]), env: env})
	}
	ignored := annotationIgnored()
	for _, r := range istioReleases {
		t.Run(r.name, func(t *testing.T) {
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					for k, v := range tc.env {
						t.Setenv(k, v)
					}
					checkRelease(t, r, tc.in, tc.injectCase, ignored)
				})
			}
		})
	}
}

// checkRelease runs one case on one release.
func checkRelease(t *testing.T, r istioRelease, in istioInstall, tc injectCase, ignored map[string]podShape) {
	pod := podFor(tc.in)
	annotation, annotated := pod.Annotations["sidecar.istio.io/nativeSidecar"]
	native := r.native.native(annotation, annotated, tc.nativeSidecars)
	// istiod's environment: ENABLE_NATIVE_SIDECARS is "true" in the
	// mesh-wide cases; from 1.27 .NativeSidecars says the same.
	if tc.nativeSidecars {
		t.Setenv("ENABLE_NATIVE_SIDECARS", "true")
	}
	got, err := r.render(t, r.data(templateData(t, in, pod, tc.nativeSidecars)))
	if err != nil {
		t.Fatalf("istiod %s would deny the pod: %v", r.name, err)
	}

	// The newest release's output for the same decisions: whether
	// istio-proxy is native, and whether istiod makes native sidecars at
	// all (the fact the supervisor's shape defaults from: the mesh-wide
	// setting, on every release). So .NativeSidecars is the setting, and
	// the pod has the annotation only where the release's answer differs
	// from it.
	bare := pod.DeepCopy()
	delete(bare.Annotations, "sidecar.istio.io/nativeSidecar")
	newest := bare
	if native != tc.nativeSidecars {
		newest = bare.DeepCopy()
		if newest.Annotations == nil {
			newest.Annotations = map[string]string{}
		}
		newest.Annotations["sidecar.istio.io/nativeSidecar"] = strconv.FormatBool(native)
	}
	t.Setenv("ENABLE_NATIVE_SIDECARS", "false")
	data := templateData(t, in, newest, tc.nativeSidecars)
	var want bytes.Buffer
	if err := in.Config.Templates["supervisor"].Execute(&want, &data); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(strings.TrimSpace(want.String()), strings.TrimSpace(got)); diff != "" {
		t.Errorf("istiod %s renders otherwise than the newest for the same native decision (%t, native sidecars mesh-wide %t) (-newest +%s):\n%s",
			r.name, native, tc.nativeSidecars, r.name, diff)
	}

	// The merged pod: the newest injector's "sidecar" for the same
	// decision, then our output as the release rendered it.
	var mode features.NativeSidecarMode = features.NativeSidecarModeDisabled
	if native {
		mode = features.NativeSidecarModeEnabled
	}
	setNativeSidecarMode(t, mode)
	lit, err := template.New("inject").Delims("\x00{", "}\x00").Parse(got)
	if err != nil {
		t.Fatal(err)
	}
	cfg := in
	cfg.Config.Templates = maps.Clone(in.Config.Templates)
	cfg.Config.Templates["supervisor"] = lit
	merged := admit(t, newWebhook(t, cfg), bare)
	wantShape := tc.want
	if s, ok := ignored[tc.name]; ok && r.native == nativeByEnv {
		wantShape = s
	}
	checkSupervised(t, merged.Spec, wantShape, tc.basics(), true, "istiod "+r.name+": injected pod", dump(merged))
	checkStatus(t, merged.Annotations, tc.status)
}

// TestIstioDataUnread: an istiod whose data will not marshal (here a field
// of a kind JSON cannot hold) gets a pod left as Istio made it, with a
// status annotation saying why, never an error.
func TestIstioDataUnread(t *testing.T) {
	in := installs(t)[0]
	r := istioReleases[len(istioReleases)-1]
	for _, obj := range []runtime.Object{
		job("odd", corev1.RestartPolicyNever, nil, "app"),
		deployment("web", "web"),
	} {
		odd := r.data(templateData(t, in, podFor(obj), false), reflect.StructField{Name: "Hook", Type: reflect.TypeFor[chan int]()})
		out, err := r.render(t, odd)
		if err != nil {
			t.Fatalf("%T: %v", obj, err)
		}
		var patch corev1.Pod
		decodeStrict(t, []byte(out), &patch)
		status := patch.Annotations[annotationPrefix+"status"]
		if !strings.HasPrefix(status, "not added: this istiod's injection data did not read as JSON") ||
			!reflect.DeepEqual(patch.Spec, corev1.PodSpec{}) {
			t.Errorf("%T: want only the status annotation, got:\n%s", obj, out)
		}
	}
}

// BenchmarkTemplates: what our template costs istiod per pod, next to
// Istio's own "sidecar" template, for a one-app Job on the newest release
// (ours marshals the template data to JSON once, to read .NativeSidecars
// where it exists).
//
//	cd e2e && go test ./inject -run '^$' -bench Templates -benchmem
func BenchmarkTemplates(b *testing.B) {
	in := installs(b)[0]
	data := templateData(b, in, podFor(job("sleep", corev1.RestartPolicyNever, nil, "app")), false)
	for _, name := range []string{"sidecar", "supervisor"} {
		b.Run(name, func(b *testing.B) {
			tmpl := in.Config.Templates[name]
			var out bytes.Buffer
			for b.Loop() {
				out.Reset()
				if err := tmpl.Execute(&out, &data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
