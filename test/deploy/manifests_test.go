// Package deploy validates deploy/kubernetes against the Kubernetes API types
// and against gymtrace itself (its config loader and capability list).
package deploy

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/gymtrace/gymtrace/internal/config"
	"github.com/gymtrace/gymtrace/internal/preflight"
)

const dir = "../../deploy/kubernetes"

// objects holds every document of daemonset.yaml, strictly decoded.
type objects struct {
	ns  *corev1.Namespace
	sa  *corev1.ServiceAccount
	cm  *corev1.ConfigMap
	ds  *appsv1.DaemonSet
	all []metav1.Object
}

// strictDecode decodes like the API server with `kubectl apply
// --validate=strict`: YAML to JSON, then case-sensitive field matching with
// unknown and duplicate fields refused (encoding/json alone would take
// `hostPid` for `hostPID`).
func strictDecode(doc []byte, into any) error {
	j, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return err
	}
	strictErrs, err := kjson.UnmarshalStrict(j, into, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	return errors.Join(strictErrs...)
}

func strict(t *testing.T, doc []byte, into any) {
	t.Helper()
	if err := strictDecode(doc, into); err != nil {
		t.Fatalf("decoding %T: %v", into, err)
	}
}

func load(t *testing.T) objects {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "daemonset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var o objects
	for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		switch tm.APIVersion + " " + tm.Kind {
		case "v1 Namespace":
			o.ns = &corev1.Namespace{}
			strict(t, []byte(doc), o.ns)
			o.all = append(o.all, o.ns)
		case "v1 ServiceAccount":
			o.sa = &corev1.ServiceAccount{}
			strict(t, []byte(doc), o.sa)
			o.all = append(o.all, o.sa)
		case "v1 ConfigMap":
			o.cm = &corev1.ConfigMap{}
			strict(t, []byte(doc), o.cm)
			o.all = append(o.all, o.cm)
		case "apps/v1 DaemonSet":
			o.ds = &appsv1.DaemonSet{}
			strict(t, []byte(doc), o.ds)
			o.all = append(o.all, o.ds)
		default:
			t.Fatalf("document %d: unexpected %s %s", i, tm.APIVersion, tm.Kind)
		}
	}
	if o.ns == nil || o.sa == nil || o.cm == nil || o.ds == nil {
		t.Fatalf("want a Namespace, ServiceAccount, ConfigMap and DaemonSet; got %+v", o)
	}
	return o
}

func stripComments(s string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestStrictDecodingCatchesTypos(t *testing.T) {
	// The decoder the other tests rely on must refuse what the API server would.
	bad := []string{
		"apiVersion: apps/v1\nkind: DaemonSet\nspec:\n  template:\n    spec:\n      hostPid: true\n",
		"apiVersion: apps/v1\nkind: DaemonSet\nspec:\n  template:\n    spec:\n      containers:\n        - name: x\n          securityContext:\n            capabilities:\n              add: BPF\n",
	}
	for _, doc := range bad {
		if err := strictDecode([]byte(doc), &appsv1.DaemonSet{}); err == nil {
			t.Errorf("accepted:\n%s", doc)
		}
	}
}

func TestDaemonSet(t *testing.T) {
	o := load(t)
	for _, obj := range o.all {
		if _, isNS := obj.(*corev1.Namespace); !isNS && obj.GetNamespace() != o.ns.Name {
			t.Errorf("%s is in namespace %q, want %q", obj.GetName(), obj.GetNamespace(), o.ns.Name)
		}
	}
	ds := o.ds
	spec := ds.Spec.Template.Spec
	if !spec.HostPID {
		t.Error("hostPID must be true: Gym servers run in other pods")
	}
	if spec.HostNetwork {
		t.Error("hostNetwork is not needed")
	}
	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	if !sel.Matches(labelSet(ds.Spec.Template.Labels)) {
		t.Error("the selector does not match the pod template's labels")
	}
	if spec.ServiceAccountName != o.sa.Name {
		t.Errorf("serviceAccountName %q, want %q", spec.ServiceAccountName, o.sa.Name)
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(spec.Containers))
	}
	c := spec.Containers[0]

	// Capabilities: exactly preflight's non-SYS_ADMIN list, nothing privileged.
	sc := c.SecurityContext
	if sc == nil || sc.Capabilities == nil {
		t.Fatal("no securityContext.capabilities")
	}
	if sc.Privileged == nil || *sc.Privileged {
		t.Error("privileged must be false (the privileged variant is a comment)")
	}
	var got []string
	for _, cp := range sc.Capabilities.Add {
		got = append(got, string(cp))
	}
	var want []string
	for _, cp := range preflight.Capabilities {
		if cp.Name != "CAP_SYS_ADMIN" {
			want = append(want, strings.TrimPrefix(cp.Name, "CAP_"))
		}
	}
	sort.Strings(got)
	sort.Strings(want)
	if !slices.Equal(got, want) {
		t.Errorf("capabilities.add = %v, want %v (preflight.Capabilities less SYS_ADMIN)", got, want)
	}
	if !slices.Contains(sc.Capabilities.Drop, "ALL") {
		t.Error("capabilities.drop should be ALL")
	}
	if sc.RunAsUser == nil || *sc.RunAsUser != 0 {
		t.Error("runAsUser must be 0: added capabilities are not effective for other users")
	}

	// Host mounts.
	vols := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		vols[v.Name] = v
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		if _, ok := vols[m.Name]; !ok {
			t.Errorf("mount %s names no volume", m.Name)
		}
		mounts[m.MountPath] = m
	}
	for _, p := range []string{"/sys/fs/cgroup", "/sys/kernel/tracing", "/sys/kernel/security", "/sys/fs/bpf"} {
		m, ok := mounts[p]
		if !ok {
			t.Errorf("no volume mounted at %s", p)
			continue
		}
		hp := vols[m.Name].HostPath
		if hp == nil || hp.Path != p {
			t.Errorf("%s is not the host's %s: %+v", p, p, vols[m.Name])
		}
	}
	if m, ok := mounts["/etc/gymtrace"]; !ok || vols[m.Name].ConfigMap == nil || vols[m.Name].ConfigMap.Name != o.cm.Name {
		t.Errorf("the ConfigMap %s is not mounted at /etc/gymtrace", o.cm.Name)
	}
	if !slices.Contains(c.Args, "--config=/etc/gymtrace/"+onlyKey(t, o.cm)) {
		t.Errorf("args %v do not point --config at the ConfigMap's file", c.Args)
	}

	// Env: OTLP endpoint and the downward API.
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	if e := env["OTEL_EXPORTER_OTLP_ENDPOINT"]; e.Value == "" && e.ValueFrom == nil {
		t.Error("OTEL_EXPORTER_OTLP_ENDPOINT is not set")
	}
	for name, path := range map[string]string{"NODE_NAME": "spec.nodeName", "POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"} {
		e := env[name]
		if e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != path {
			t.Errorf("%s should come from the downward API field %s: %+v", name, path, e)
		}
	}

	// Resources, probes, ports.
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		req, lim := c.Resources.Requests[r], c.Resources.Limits[r]
		if req.IsZero() || lim.IsZero() || req.Cmp(lim) > 0 {
			t.Errorf("%s request %s limit %s: both must be set, request <= limit", r, req.String(), lim.String())
		}
	}
	var metrics *corev1.ContainerPort
	for i := range c.Ports {
		if c.Ports[i].Name == "metrics" {
			metrics = &c.Ports[i]
		}
	}
	if metrics == nil {
		t.Fatal("no metrics port")
	}
	for name, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" || p.HTTPGet.Port.String() != metrics.Name {
			t.Errorf("%s probe should GET /healthz on the metrics port: %+v", name, p)
		}
	}
	if ann := ds.Spec.Template.Annotations["prometheus.io/port"]; ann != itoa(metrics.ContainerPort) {
		t.Errorf("prometheus.io/port %q, metrics port %d", ann, metrics.ContainerPort)
	}
}

func onlyKey(t *testing.T, cm *corev1.ConfigMap) string {
	if len(cm.Data) != 1 {
		t.Fatalf("ConfigMap has %d keys, want 1", len(cm.Data))
	}
	for k := range cm.Data {
		return k
	}
	return ""
}

type labelSet map[string]string

func (l labelSet) Has(k string) bool              { _, ok := l[k]; return ok }
func (l labelSet) Get(k string) string            { return l[k] }
func (l labelSet) Lookup(k string) (string, bool) { v, ok := l[k]; return v, ok }

func itoa(n int32) string { return strconv.Itoa(int(n)) }

// The ConfigMap is read by gymtrace's own loader exactly as the pod will: its
// file via --config, the endpoint from the DaemonSet's env.
func TestConfigMapLoads(t *testing.T) {
	o := load(t)
	key := onlyKey(t, o.cm)
	body := o.cm.Data[key]
	if !regexp.MustCompile(`(?m)^telemetry:\s*$`).MatchString(body) || !regexp.MustCompile(`(?m)^gymtrace:\s*$`).MatchString(body) {
		t.Fatalf("the config needs a Gym-style telemetry: block and a gymtrace: section:\n%s", body)
	}
	path := filepath.Join(t.TempDir(), key)
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "GYMTRACE_") || strings.HasPrefix(k, "OTEL_") {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
	for _, e := range o.ds.Spec.Template.Spec.Containers[0].Env {
		if strings.HasPrefix(e.Name, "OTEL_EXPORTER_OTLP_") && e.Value != "" {
			t.Setenv(e.Name, e.Value)
		}
	}
	// The pod's args, with --config pointing at the copy written here.
	var args []string
	for _, a := range o.ds.Spec.Template.Spec.Containers[0].Args {
		if strings.HasPrefix(a, "--config=") {
			a = "--config=" + path
		}
		args = append(args, a)
	}
	cfg, err := config.NewLoader(args, slog.New(slog.NewTextHandler(io.Discard, nil))).Load()
	if err != nil {
		t.Fatalf("gymtrace rejects the ConfigMap: %v", err)
	}
	if cfg.MetricsAddr != ":9464" || !cfg.Discover || cfg.Exporter != config.ExporterOTLP || cfg.OTLPEndpoint == "" || cfg.SpanGroups != "default" {
		t.Errorf("loaded config = %+v", cfg)
	}
}

// kustomization.yaml: strict against the fields kustomize's v1beta1 type has
// that this file uses, and every resource exists.
func TestKustomization(t *testing.T) {
	type image struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
		Digest  string `json:"digest,omitempty"`
	}
	var k struct {
		APIVersion string   `json:"apiVersion"`
		Kind       string   `json:"kind"`
		Resources  []string `json:"resources"`
		Images     []image  `json:"images"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := strictDecode(b, &k); err != nil {
		t.Fatal(err)
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		t.Errorf("apiVersion/kind = %s/%s", k.APIVersion, k.Kind)
	}
	for _, r := range k.Resources {
		if _, err := os.Stat(filepath.Join(dir, r)); err != nil {
			t.Errorf("resource %s: %v", r, err)
		}
	}
	o := load(t)
	img := o.ds.Spec.Template.Spec.Containers[0].Image
	found := false
	for _, i := range k.Images {
		found = found || strings.HasPrefix(img, i.Name+":") || img == i.Name
	}
	if !found {
		t.Errorf("no images: entry rewrites the DaemonSet's image %q", img)
	}
}
