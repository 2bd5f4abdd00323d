package export

import (
	"os"
	"strconv"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"

	"github.com/gymtrace/gymtrace/internal/discover"
)

// Role numbers as in bpf/common/contract.h (loader.Role*). They are written out
// here so this package builds off Linux; a Linux-only test checks they agree.
const (
	roleUnknown      = 0
	roleAgent        = 1
	roleModel        = 2
	roleResources    = 3
	roleOrchestrator = 4
)

// ServerType is Gym's server type for a role number, "" when unknown.
func ServerType(role uint8) string {
	switch role {
	case roleAgent:
		return "responses_api_agents"
	case roleModel:
		return "responses_api_models"
	case roleResources:
		return "resources_servers"
	case roleOrchestrator:
		return "orchestrator"
	}
	return ""
}

// ServiceName is service.name as Gym sets it for a process: nemo-gym/<server
// name>, nemo-gym/orchestrator for the collector, and nemo-gym/<comm> while the
// server name is unknown.
func ServiceName(p *discover.Process) string {
	switch {
	case p == nil:
		return "nemo-gym/unknown"
	case p.Role == roleOrchestrator:
		return "nemo-gym/orchestrator"
	case p.ServerName != "":
		return "nemo-gym/" + p.ServerName
	case p.Comm != "":
		return "nemo-gym/" + p.Comm
	case p.PID != 0:
		return "nemo-gym/pid-" + strconv.Itoa(p.PID)
	}
	return "nemo-gym/unknown"
}

// ResourceAttrs are the resource attributes of a traced process.
func ResourceAttrs(p *discover.Process, hostName string) []attribute.KeyValue {
	attrs := []attribute.KeyValue{attribute.String("service.name", ServiceName(p))}
	if hostName != "" {
		attrs = append(attrs, attribute.String("host.name", hostName))
	}
	if p == nil {
		return attrs
	}
	name := p.ServerName
	if name == "" && p.Role == roleOrchestrator {
		name = "orchestrator"
	}
	if name != "" {
		attrs = append(attrs, attribute.String("nemo.gym.server.name", name))
	}
	if t := ServerType(p.Role); t != "" {
		attrs = append(attrs, attribute.String("nemo.gym.server.type", t))
	}
	if p.PID != 0 {
		attrs = append(attrs, attribute.Int("process.pid", p.PID))
	}
	if p.ContainerID != "" {
		attrs = append(attrs, attribute.String("container.id", p.ContainerID))
	}
	if p.K8sPodName != "" {
		attrs = append(attrs, attribute.String("k8s.pod.name", p.K8sPodName))
	}
	if p.K8sNamespace != "" {
		attrs = append(attrs, attribute.String("k8s.namespace.name", p.K8sNamespace))
	}
	if p.K8sNodeName != "" {
		attrs = append(attrs, attribute.String("k8s.node.name", p.K8sNodeName))
	}
	return attrs
}

// maxCachedResources bounds the cache: a host that churns through many short
// processes must not grow it without end. Past it the cache starts over.
const maxCachedResources = 4096

// Resources builds and caches one Resource per process identity. Keyed by the
// Process value, not the pointer, so a process whose role or name is learnt
// later gets a fresh Resource. Safe for concurrent use.
type Resources struct {
	host string
	mu   sync.Mutex
	m    map[discover.Process]*resource.Resource
}

// NewResources returns a cache for resources on host hostName; "" means
// os.Hostname().
func NewResources(hostName string) *Resources {
	if hostName == "" {
		hostName, _ = os.Hostname()
	}
	return &Resources{host: hostName, m: make(map[discover.Process]*resource.Resource)}
}

// HostName is the host.name the cache puts on every resource.
func (r *Resources) HostName() string { return r.host }

// For returns the Resource of p (nil p: an unknown process).
func (r *Resources) For(p *discover.Process) *resource.Resource {
	var key discover.Process
	if p != nil {
		key = *p
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if res, ok := r.m[key]; ok {
		return res
	}
	if len(r.m) >= maxCachedResources {
		clear(r.m)
	}
	// Schemaless: the keys are fixed strings, and a schema URL would have to
	// match the SDK's own default resource to merge cleanly.
	res := resource.NewSchemaless(ResourceAttrs(p, r.host)...)
	r.m[key] = res
	return res
}
