package kubernetes

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// strict decodes one YAML document into out, refusing fields the type
// does not have: a misspelt or misplaced key fails here, as a schema
// validator would fail it.
func strict(doc []byte, out any) error {
	js, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	return dec.Decode(out)
}

type manifests struct {
	svc *corev1.Service
	sts *appsv1.StatefulSet
}

func load(t *testing.T, src []byte) (manifests, error) {
	t.Helper()
	var m manifests
	for i, doc := range bytes.Split(src, []byte("\n---\n")) {
		var head struct{ APIVersion, Kind string }
		if err := yaml.Unmarshal(doc, &head); err != nil {
			return m, fmt.Errorf("document %d: %w", i, err)
		}
		switch head.APIVersion + "/" + head.Kind {
		case "v1/Service":
			m.svc = &corev1.Service{}
			if err := strict(doc, m.svc); err != nil {
				return m, fmt.Errorf("document %d (Service): %w", i, err)
			}
		case "apps/v1/StatefulSet":
			m.sts = &appsv1.StatefulSet{}
			if err := strict(doc, m.sts); err != nil {
				return m, fmt.Errorf("document %d (StatefulSet): %w", i, err)
			}
		default:
			return m, fmt.Errorf("document %d: unexpected %s %s", i, head.APIVersion, head.Kind)
		}
	}
	if m.svc == nil || m.sts == nil {
		return m, fmt.Errorf("want a Service and a StatefulSet")
	}
	return m, nil
}

// check tests that the pieces fit: what a typo in a name, a label or a
// port would break without any schema error.
func check(m manifests) []string {
	var probs []string
	bad := func(format string, args ...any) { probs = append(probs, fmt.Sprintf(format, args...)) }
	svc, sts := m.svc, m.sts
	if svc.Spec.ClusterIP != corev1.ClusterIPNone {
		bad("the Service is not headless (clusterIP %q): clients need each shard's address", svc.Spec.ClusterIP)
	}
	if sts.Spec.ServiceName != svc.Name {
		bad("the StatefulSet's serviceName %q is not the Service %q", sts.Spec.ServiceName, svc.Name)
	}
	labels := sts.Spec.Template.Labels
	for k, v := range sts.Spec.Selector.MatchLabels {
		if labels[k] != v {
			bad("selector %s=%s does not match the pod template's labels %v", k, v, labels)
		}
	}
	for k, v := range svc.Spec.Selector {
		if labels[k] != v {
			bad("the Service selects %s=%s, which the pods do not carry", k, v)
		}
	}
	if sts.Spec.Replicas == nil || *sts.Spec.Replicas < 2 {
		bad("fewer than 2 shards")
	}
	pod := sts.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		bad("%d containers, want 1", len(pod.Containers))
		return probs
	}
	c := pod.Containers[0]
	if len(c.Args) == 0 || c.Args[0] != "serve" {
		bad("the container does not run rbd serve: args %v", c.Args)
	}
	var dataDir string
	addrOK := false
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--data="); ok {
			dataDir = v
		}
		if a == "--addr=0.0.0.0:7450" {
			addrOK = true
		}
	}
	if !addrOK {
		bad("rbd must listen on all addresses (--addr=0.0.0.0:7450), args %v", c.Args)
	}
	if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
		return e.Name == "RBD_TOKEN" && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil
	}) {
		bad("no RBD_TOKEN from a Secret: rbd refuses a non-loopback address without a token")
	}
	portName := ""
	for _, p := range c.Ports {
		if p.ContainerPort == 7450 {
			portName = p.Name
		}
	}
	if portName == "" {
		bad("no container port 7450")
	}
	for _, sp := range svc.Spec.Ports {
		if sp.TargetPort.String() != portName && sp.TargetPort.IntValue() != 7450 {
			bad("the Service's port %s targets %s, not the container's %q", sp.Name, sp.TargetPort.String(), portName)
		}
	}
	for what, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/v1/health" {
			bad("no %s probe on /v1/health (the one endpoint that needs no token)", what)
		}
	}
	if c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() || c.Resources.Requests.Cpu().IsZero() {
		bad("no memory request and limit, or no CPU request")
	}
	mounted := false
	for _, vm := range c.VolumeMounts {
		if vm.MountPath == dataDir && slices.ContainsFunc(sts.Spec.VolumeClaimTemplates, func(p corev1.PersistentVolumeClaim) bool { return p.Name == vm.Name }) {
			mounted = true
		}
	}
	if dataDir == "" || !mounted {
		bad("the data dir %q is not a volume claim of the StatefulSet: a shard would lose its rows on a restart", dataDir)
	}
	if a := sts.Spec.Template.Annotations; a["prometheus.io/scrape"] != "true" || a["prometheus.io/path"] != "/metrics" {
		bad("no Prometheus scrape annotations")
	}
	return probs
}

func TestManifests(t *testing.T) {
	src, err := os.ReadFile("rbd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m, err := load(t, src)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range check(m) {
		t.Error(p)
	}
}

// The checks are not vacuous: each alteration of rbd.yaml a typo would
// make is caught, by the strict decoding or by check.
func TestManifestsCatchMistakes(t *testing.T) {
	src, err := os.ReadFile("rbd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, old, new string }{
		{"misspelt key", "readinessProbe:", "readynessProbe:"},
		{"key at the wrong level", "      terminationGracePeriodSeconds: 30", "  terminationGracePeriodSeconds: 30"},
		{"wrong type", "replicas: 3", "replicas: three"},
		{"not headless", "clusterIP: None", "clusterIP: 10.0.0.9"},
		{"serviceName typo", "serviceName: rbd", "serviceName: rdb"},
		{"probe path", "path: /v1/health\n              port: http\n            periodSeconds: 5", "path: /health\n              port: http\n            periodSeconds: 5"},
		{"no token", "name: RBD_TOKEN", "name: RBD_TOKN"},
		{"data dir not on the volume", "--data=/data", "--data=/var/rbd"},
		{"loopback address", "--addr=0.0.0.0:7450", "--addr=127.0.0.1:7450"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !bytes.Contains(src, []byte(tc.old)) {
				t.Fatalf("rbd.yaml no longer contains %q: update this case", tc.old)
			}
			bad := bytes.Replace(src, []byte(tc.old), []byte(tc.new), 1)
			m, err := load(t, bad)
			if err == nil && len(check(m)) == 0 {
				t.Fatalf("the alteration %q -> %q passed", tc.old, tc.new)
			}
		})
	}
}
