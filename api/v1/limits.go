package apiv1

// MaxMessage bounds one request or reply on the agent's unix socket (both
// ends; gRPC's default is 4 MiB to receive). A cluster's objects outgrow 4 MiB:
// `lanekit service list` at 30,000 Services is a 5 MB reply. The socket is the
// node's root's alone (mode 0600), so the bound is for sanity, not defence.
const MaxMessage = 64 << 20
