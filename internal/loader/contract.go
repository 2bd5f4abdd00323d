//go:build linux

package loader

// Exported names for the kernel <-> userspace contract. The types are generated
// by bpf2go from bpf/common/contract.h; these aliases are the only place Go
// names them, so a field added in C appears here on the next `go generate`.

import "unsafe"

// HTTPEvent is one record of the gt_events ring buffer (struct http_event).
type HTTPEvent = bpfHttpEvent

// ProcEvent is a process lifecycle record of the same ring buffer
// (struct proc_event); its first byte is the kind, like HTTPEvent's.
type ProcEvent = bpfProcEvent

// ProcEventSize is the size in bytes of a lifecycle record.
const ProcEventSize = int(unsafe.Sizeof(ProcEvent{}))

// GenAIEvent is the record of a model exchange's GenAI values (struct
// genai_event): model names and token counts the kernel read from its
// bodies, emitted right before the exchange's response record.
type GenAIEvent = bpfGenaiEvent

// GenAIEventSize is the size in bytes of a GenAI record.
const GenAIEventSize = int(unsafe.Sizeof(GenAIEvent{}))

// Target is a gt_targets value (struct gt_target).
type Target = bpfGtTarget

// Config is the gate configuration (struct gt_config).
type Config = bpfGtConfig

// RouteKey is a gt_routes key (struct gt_route_key).
type RouteKey = bpfGtRouteKey

// HTTPEventSize is the size in bytes of one ring-buffer record.
const HTTPEventSize = int(unsafe.Sizeof(HTTPEvent{}))

// HTTPEventHeadSize is the length of response and close records: the fields
// before Reward (GT_HTTP_EVENT_HEAD in bpf/common/contract.h).
const HTTPEventHeadSize = int(unsafe.Offsetof(HTTPEvent{}.Reward))

// HTTPEventRewardSize is the length of a response record with FlagReward:
// the head and the reward's text (GT_HTTP_EVENT_REWARD).
const HTTPEventRewardSize = int(unsafe.Offsetof(HTTPEvent{}.Path))

// Event kinds.
const (
	EvRequest  = uint8(bpfGtEventKindGT_EV_REQUEST)
	EvResponse = uint8(bpfGtEventKindGT_EV_RESPONSE)
	EvClose    = uint8(bpfGtEventKindGT_EV_CLOSE)

	EvProcFork     = uint8(bpfGtEventKindGT_EV_PROC_FORK)
	EvProcExec     = uint8(bpfGtEventKindGT_EV_PROC_EXEC)
	EvProcExit     = uint8(bpfGtEventKindGT_EV_PROC_EXIT)
	EvSandboxStart = uint8(bpfGtEventKindGT_EV_SANDBOX_START)
	EvSandboxEnd   = uint8(bpfGtEventKindGT_EV_SANDBOX_END)
	// The startup group's records (bpf/startup.h): a process born under a
	// target listened, and first answered on that port. proc_event's Port.
	EvStartupListen = uint8(bpfGtEventKindGT_EV_STARTUP_LISTEN)
	EvStartupReady  = uint8(bpfGtEventKindGT_EV_STARTUP_READY)
	EvGenAI         = uint8(bpfGtEventKindGT_EV_GENAI)
)

// GenAI dialects (genai_event.dialect) and the values a record holds
// (genai_event.have).
const (
	DialectChat      = uint8(bpfGtGenaiDialectGT_GENAI_CHAT)
	DialectResponses = uint8(bpfGtGenaiDialectGT_GENAI_RESPONSES)
	DialectMessages  = uint8(bpfGtGenaiDialectGT_GENAI_MESSAGES)

	GenAIReqModel  = uint8(bpfGtGenaiHaveGT_GH_REQ_MODEL)
	GenAIRespModel = uint8(bpfGtGenaiHaveGT_GH_RESP_MODEL)
	GenAIInput     = uint8(bpfGtGenaiHaveGT_GH_INPUT)
	GenAIOutput    = uint8(bpfGtGenaiHaveGT_GH_OUTPUT)
)

// Sandbox providers and verbs (proc_event.provider, .verb).
const (
	SandboxNone      = uint8(bpfGtSandboxProviderGT_SB_NONE)
	SandboxDocker    = uint8(bpfGtSandboxProviderGT_SB_DOCKER)
	SandboxApptainer = uint8(bpfGtSandboxProviderGT_SB_APPTAINER)
	SandboxEnroot    = uint8(bpfGtSandboxProviderGT_SB_ENROOT)

	SandboxVerbOther = uint8(bpfGtSandboxVerbGT_SBV_OTHER)
	SandboxVerbStart = uint8(bpfGtSandboxVerbGT_SBV_START)
	SandboxVerbExec  = uint8(bpfGtSandboxVerbGT_SBV_EXEC)
)

// IsProcEvent reports whether a ring-buffer record (by its first byte) is a
// lifecycle record rather than an HTTP one.
func IsProcEvent(kind uint8) bool {
	return kind >= EvProcFork && kind <= EvSandboxEnd || kind == EvStartupListen || kind == EvStartupReady
}

// Connection sides.
const (
	SideUnknown = uint8(bpfGtSideGT_SIDE_UNKNOWN)
	SideServer  = uint8(bpfGtSideGT_SIDE_SERVER)
	SideClient  = uint8(bpfGtSideGT_SIDE_CLIENT)
)

// Roles (Gym server types).
const (
	RoleUnknown      = uint8(bpfGtRoleGT_ROLE_UNKNOWN)
	RoleAgent        = uint8(bpfGtRoleGT_ROLE_AGENT)
	RoleModel        = uint8(bpfGtRoleGT_ROLE_MODEL)
	RoleResources    = uint8(bpfGtRoleGT_ROLE_RESOURCES)
	RoleOrchestrator = uint8(bpfGtRoleGT_ROLE_ORCHESTRATOR)
)

// HTTP methods.
const (
	MethodUnknown = uint8(bpfGtMethodGT_M_UNKNOWN)
	MethodGET     = uint8(bpfGtMethodGT_M_GET)
	MethodPOST    = uint8(bpfGtMethodGT_M_POST)
	MethodPUT     = uint8(bpfGtMethodGT_M_PUT)
	MethodDELETE  = uint8(bpfGtMethodGT_M_DELETE)
	MethodPATCH   = uint8(bpfGtMethodGT_M_PATCH)
	MethodHEAD    = uint8(bpfGtMethodGT_M_HEAD)
	MethodOPTIONS = uint8(bpfGtMethodGT_M_OPTIONS)
	MethodCONNECT = uint8(bpfGtMethodGT_M_CONNECT)
	MethodTRACE   = uint8(bpfGtMethodGT_M_TRACE)
)

// Event flags.
const (
	FlagTraceparent   = uint16(bpfGtEventFlagGT_F_TRACEPARENT)
	FlagKernelTrace   = uint16(bpfGtEventFlagGT_F_KERNEL_TRACE)
	FlagPathTruncated = uint16(bpfGtEventFlagGT_F_PATH_TRUNCATED)
	FlagEndByClose    = uint16(bpfGtEventFlagGT_F_END_BY_CLOSE)
	FlagChunked       = uint16(bpfGtEventFlagGT_F_CHUNKED)
	FlagUpgrade       = uint16(bpfGtEventFlagGT_F_UPGRADE)
	FlagResync        = uint16(bpfGtEventFlagGT_F_RESYNC)
	FlagConnError     = uint16(bpfGtEventFlagGT_F_CONN_ERROR)
	FlagHost          = uint16(bpfGtEventFlagGT_F_HOST)
	FlagRollout       = uint16(bpfGtEventFlagGT_F_ROLLOUT)
	FlagHdrTruncated  = uint16(bpfGtEventFlagGT_F_HDR_TRUNCATED)
	FlagBodyUnknown   = uint16(bpfGtEventFlagGT_F_BODY_UNKNOWN)
	FlagTLS           = uint16(bpfGtEventFlagGT_F_TLS) // plaintext seen through the TLS library: https
	// FlagFresh (requests): the kernel followed the connection from the
	// first byte in this direction, so both ends' requests pair in order.
	FlagFresh = uint16(bpfGtEventFlagGT_F_FRESH)
	// FlagReward (server responses to /verify): Reward holds the text of
	// the body's top-level "reward" number, NUL-padded.
	FlagReward = uint16(bpfGtEventFlagGT_F_REWARD)
)

// What a request record says the kernel lost on its connection before it
// (HTTPEvent.Gap bits, enum gt_gap).
const (
	// GapFraming: this side's framing was lost at least once, so its
	// request index (Seq) may differ from the peer's.
	GapFraming = uint8(bpfGtGapGT_GAP_FRAMING)
	// GapLost: a record of the connection was lost since the previous
	// request record (ring buffer full).
	GapLost = uint8(bpfGtGapGT_GAP_LOST)
	// GapLate: this request's record is late: the ring buffer had no room
	// when the request ended, and it was written later, at its handler's
	// first call or its response's first bytes. Records of calls its
	// handler made before that came before it.
	GapLate = uint8(bpfGtGapGT_GAP_LATE)
)

// Statistics slots in the per-CPU gt_stats array.
const (
	StatEmitted       = uint32(bpfGtStatGT_STAT_EMITTED)
	StatDiscarded     = uint32(bpfGtStatGT_STAT_DISCARDED)
	StatRingbufFull   = uint32(bpfGtStatGT_STAT_RINGBUF_FULL)
	StatNotHTTP       = uint32(bpfGtStatGT_STAT_NOT_HTTP)
	StatParseError    = uint32(bpfGtStatGT_STAT_PARSE_ERROR)
	StatHdrTruncated  = uint32(bpfGtStatGT_STAT_HDR_TRUNCATED)
	StatConnFull      = uint32(bpfGtStatGT_STAT_CONN_FULL)
	StatResync        = uint32(bpfGtStatGT_STAT_RESYNC)
	StatSkippedBytes  = uint32(bpfGtStatGT_STAT_SKIPPED_BYTES)
	StatProcEvents    = uint32(bpfGtStatGT_STAT_PROC_EVENTS)
	StatUnsampled     = uint32(bpfGtStatGT_STAT_UNSAMPLED)
	StatScanReused    = uint32(bpfGtStatGT_STAT_SCAN_REUSED)
	StatFresh         = uint32(bpfGtStatGT_STAT_FRESH)           // connections followed from their first byte
	StatRewardFound   = uint32(bpfGtStatGT_STAT_REWARD_FOUND)    // /verify responses whose reward the kernel read
	StatRewardMissed  = uint32(bpfGtStatGT_STAT_REWARD_MISSED)   // ... meant to be scanned, with no usable reward
	StatTLSCalls      = uint32(bpfGtStatGT_STAT_TLS_CALLS)       // TLS probe runs in targets
	StatTLSEvents     = uint32(bpfGtStatGT_STAT_TLS_EVENTS)      // records emitted from TLS plaintext
	StatTLSLinked     = uint32(bpfGtStatGT_STAT_TLS_LINKED)      // SSL objects linked to their socket
	StatScanPreread   = uint32(bpfGtStatGT_STAT_SCAN_PREREAD)    // header blocks scanned from the read at their start
	StatStreamGap     = uint32(bpfGtStatGT_STAT_STREAM_GAP)      // bytes of a followed connection moved unseen
	StatStreamGapBody = uint32(bpfGtStatGT_STAT_STREAM_GAP_BODY) // ... inside a Content-Length body: nothing lost
	// A model exchange's GenAI fields (request model, response model,
	// input and output tokens), one count per field: read, or why not.
	StatGenAIRead       = uint32(bpfGtStatGT_STAT_GENAI_READ)
	StatGenAIAbsent     = uint32(bpfGtStatGT_STAT_GENAI_ABSENT)
	StatGenAIAmbiguous  = uint32(bpfGtStatGT_STAT_GENAI_AMBIGUOUS)
	StatGenAIMalformed  = uint32(bpfGtStatGT_STAT_GENAI_MALFORMED)
	StatGenAIIncomplete = uint32(bpfGtStatGT_STAT_GENAI_INCOMPLETE)
	StatStaleConn       = uint32(bpfGtStatGT_STAT_STALE_CONN)    // entries whose fd names another socket now
	StatStoodIn         = uint32(bpfGtStatGT_STAT_STOOD_IN)      // syscall events an understudy handled: its program was skipped
	StatResponseShed    = uint32(bpfGtStatGT_STAT_RESPONSE_SHED) // response records not written: the buffer's last eighth is for requests
	StatRequestLate     = uint32(bpfGtStatGT_STAT_REQUEST_LATE)  // request records written late (at a call or their response) after a failed reservation
	StatMax             = uint32(bpfGtStatGT_STAT_MAX)
)

// Slots of the syscall programs that have an understudy
// (bpf/common/understudy.h, enum gt_sys_prog).
const (
	SysExitRead      = uint32(bpfGtSysProgGT_SYS_EXIT_READ)
	SysExitRecvfrom  = uint32(bpfGtSysProgGT_SYS_EXIT_RECVFROM)
	SysExitReadv     = uint32(bpfGtSysProgGT_SYS_EXIT_READV)
	SysExitRecvmsg   = uint32(bpfGtSysProgGT_SYS_EXIT_RECVMSG)
	SysExitWrite     = uint32(bpfGtSysProgGT_SYS_EXIT_WRITE)
	SysExitSendto    = uint32(bpfGtSysProgGT_SYS_EXIT_SENDTO)
	SysExitWritev    = uint32(bpfGtSysProgGT_SYS_EXIT_WRITEV)
	SysExitSendmsg   = uint32(bpfGtSysProgGT_SYS_EXIT_SENDMSG)
	SysEnterClose    = uint32(bpfGtSysProgGT_SYS_ENTER_CLOSE)
	SysExitListen    = uint32(bpfGtSysProgGT_SYS_EXIT_LISTEN)
	SysInjectWrite   = uint32(bpfGtSysProgGT_SYS_INJECT_WRITE)
	SysInjectSendto  = uint32(bpfGtSysProgGT_SYS_INJECT_SENDTO)
	SysInjectWritev  = uint32(bpfGtSysProgGT_SYS_INJECT_WRITEV)
	SysInjectSendmsg = uint32(bpfGtSysProgGT_SYS_INJECT_SENDMSG)
	SysProgs         = uint32(bpfGtSysProgGT_SYS_PROGS)
)

// Config flags.
const (
	CfgRolloutIDs = uint32(bpfGtConfigFlagGT_CFG_ROLLOUT_IDS)
	CfgNoGate     = uint32(bpfGtConfigFlagGT_CFG_NO_GATE)
	CfgReward     = uint32(bpfGtConfigFlagGT_CFG_REWARD) // read the reward from /verify response bodies
	CfgGenAI      = uint32(bpfGtConfigFlagGT_CFG_GENAI)  // read model names and token counts from model exchanges
	// CfgKeepUnsampled copies out inbound requests whose traceparent says
	// not sampled (their spans are still not exported): Gym's metrics.
	CfgKeepUnsampled = uint32(bpfGtConfigFlagGT_CFG_KEEP_UNSAMPLED)
)
