// Package discover finds the processes gymtrace traces and what Gym calls them.
package discover

// Process is what gymtrace knows about one traced process: its Gym identity
// (for span names and resource attributes) and where it runs.
type Process struct {
	PID         int    // tgid in the initial PID namespace
	NSPID       int    // pid inside its own PID namespace (== PID when not containerised)
	Role        uint8  // loader.Role* (Gym server type); RoleUnknown until known
	ServerName  string // Gym server name (NEMO_GYM_CONFIG_PATH), or from the command line
	Comm        string
	ContainerID string // from /proc/PID/cgroup, "" on the host
	// Kubernetes placement, when the DaemonSet's downward API or cgroup paths give it.
	K8sPodName, K8sNamespace, K8sNodeName string

	// Added by discovery (issue 8).
	K8sPodUID string // from a kubepods cgroup path, dashes restored
	PPID      int    // parent tgid, initial PID namespace
	// StartTime is /proc/PID/stat field 22 (clock ticks after boot). With PID it
	// names a process uniquely: a reused PID has a different start time.
	StartTime uint64
	Worker    bool // a uvicorn worker (IS_NEMO_GYM_FASTAPI_WORKER=1 or a forked child of a Gym server)
}
