package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cilium/ebpf"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	apiv1 "github.com/lanekit/lanekit/api/v1"
)

// `lanekit sysdump`: what a bug report needs from one node, in one
// archive. Every part is collected on its own: one that fails is recorded
// as PART.error with the reason, and the dump goes on.

var sysdumpOpts struct {
	out      string
	bpfDir   string
	logs     []string
	logBytes int64
}

// defaultAgentLogs are where the agent's logs are: the DaemonSet's
// container logs (kubelet writes the pods' stderr there) and the lab's.
var defaultAgentLogs = []string{
	"/var/log/pods/lanekit-system_lanekit-agent-*/*/*.log",
	"/run/lanekit/lab/lk-node*/agent.log",
}

// dumpPart is one file of the archive.
type dumpPart struct {
	name    string
	collect func(ctx context.Context) ([]byte, error)
}

func sysdumpCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sysdump",
		Short: "Collect the agent's status, maps, logs, kernel features and node check into one archive for a bug report",
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := sysdumpOpts.out
			if out == "" {
				out = "lanekit-sysdump-" + time.Now().UTC().Format("20060102-150405") + ".tar.gz"
			}
			failed, err := writeSysdump(cmd.Context(), out, sysdumpParts())
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "sysdump written to %s", out)
			if len(failed) > 0 {
				fmt.Fprintf(cmd.OutOrStdout(), " (%d parts failed, their errors are in the archive: %s)", len(failed), strings.Join(failed, ", "))
			}
			fmt.Fprintln(cmd.OutOrStdout())
			return nil
		},
	}
	addSocketFlag(cmd)
	f := cmd.Flags()
	f.StringVarP(&sysdumpOpts.out, "output", "o", "", "archive to write (default lanekit-sysdump-<UTC time>.tar.gz)")
	f.StringVar(&sysdumpOpts.bpfDir, "bpf-dir", "/sys/fs/bpf/lanekit", "the agent's pin directory (its maps are summarised)")
	f.StringSliceVar(&sysdumpOpts.logs, "log", defaultAgentLogs, "agent log files (globs); the last --log-bytes of each")
	f.Int64Var(&sysdumpOpts.logBytes, "log-bytes", 4<<20, "bytes kept from the end of each log")
	return cmd
}

func init() { rootCmd.AddCommand(sysdumpCmd()) }

// sysdumpParts are the archive's files.
func sysdumpParts() []dumpPart {
	agent := func(call func(context.Context, apiv1.AgentClient) (proto.Message, error)) func(context.Context) ([]byte, error) {
		return func(ctx context.Context) ([]byte, error) {
			c, closeFn, err := dialAgent()
			if err != nil {
				return nil, err
			}
			defer closeFn()
			ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			m, err := call(ctx, c)
			if err != nil {
				return nil, err
			}
			return protojson.MarshalOptions{Multiline: true, Indent: "  "}.Marshal(m)
		}
	}
	return []dumpPart{
		{"versions.txt", dumpVersions},
		{"agent/status.json", agent(func(ctx context.Context, c apiv1.AgentClient) (proto.Message, error) {
			return c.Status(ctx, &apiv1.StatusRequest{})
		})},
		{"agent/endpoints.json", agent(func(ctx context.Context, c apiv1.AgentClient) (proto.Message, error) {
			return c.ListEndpoints(ctx, &apiv1.ListEndpointsRequest{})
		})},
		{"agent/vms.json", agent(func(ctx context.Context, c apiv1.AgentClient) (proto.Message, error) {
			return c.ListVMs(ctx, &apiv1.ListVMsRequest{})
		})},
		{"agent/services.json", agent(func(ctx context.Context, c apiv1.AgentClient) (proto.Message, error) {
			return c.ListServices(ctx, &apiv1.ListServicesRequest{})
		})},
		{"agent/policies.json", agent(func(ctx context.Context, c apiv1.AgentClient) (proto.Message, error) {
			return c.ListPolicies(ctx, &apiv1.ListPoliciesRequest{})
		})},
		{"maps.txt", func(context.Context) ([]byte, error) { return dumpMaps(sysdumpOpts.bpfDir) }},
		{"status.txt", inProcess(func(c *cobra.Command) error {
			statusOpts.bpfDir, statusOpts.wait = sysdumpOpts.bpfDir, false
			return statusCmd.RunE(c, nil)
		})},
		{"node-check.txt", inProcess(func(c *cobra.Command) error { return runNodeCheck(c, nil) })},
		{"logs/", nil}, // dumpLogs adds one file per log
	}
}

// writeSysdump writes the parts into a gzipped tar at path; it returns the
// parts that failed (recorded as NAME.error).
func writeSysdump(ctx context.Context, path string, parts []dumpPart) ([]string, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	zw := gzip.NewWriter(f)
	tw := tar.NewWriter(zw)
	root := strings.TrimSuffix(filepath.Base(path), ".tar.gz")
	add := func(name string, data []byte) error {
		hdr := &tar.Header{Name: root + "/" + name, Mode: 0o644, Size: int64(len(data)), ModTime: time.Now(), Typeflag: tar.TypeReg}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	var failed []string
	for _, p := range parts {
		if p.name == "logs/" {
			for name, data := range dumpLogs(sysdumpOpts.logs, sysdumpOpts.logBytes) {
				if strings.HasSuffix(name, ".error") {
					failed = append(failed, name)
				}
				if err := add("logs/"+name, data); err != nil {
					return failed, err
				}
			}
			continue
		}
		data, err := p.collect(ctx)
		name := p.name
		if err != nil {
			failed = append(failed, p.name)
			name, data = p.name+".error", append(data, []byte(fmt.Sprintf("\ncollecting %s failed: %v\n", p.name, err))...)
		}
		if err := add(name, data); err != nil {
			return failed, err
		}
	}
	if err := tw.Close(); err != nil {
		return failed, err
	}
	if err := zw.Close(); err != nil {
		return failed, err
	}
	return failed, f.Close()
}

func dumpVersions(context.Context) ([]byte, error) {
	var b bytes.Buffer
	if bi, ok := debug.ReadBuildInfo(); ok {
		fmt.Fprintf(&b, "lanekit CLI: %s (%s)\n", bi.Main.Version, bi.GoVersion)
		for _, s := range bi.Settings {
			if strings.HasPrefix(s.Key, "vcs.") {
				fmt.Fprintf(&b, "  %s=%s\n", s.Key, s.Value)
			}
		}
	}
	for _, f := range []string{"/proc/version", "/etc/os-release"} {
		data, err := os.ReadFile(f)
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", f, err)
			continue
		}
		fmt.Fprintf(&b, "--- %s\n%s", f, data)
	}
	return b.Bytes(), nil
}

// inProcess runs a command's action (with its flags' defaults) into a
// buffer: its output is kept with the error.
func inProcess(run func(*cobra.Command) error) func(context.Context) ([]byte, error) {
	return func(ctx context.Context) ([]byte, error) {
		var b bytes.Buffer
		c := &cobra.Command{}
		c.SetOut(&b)
		c.SetErr(&b)
		c.SetContext(ctx)
		err := run(c)
		return b.Bytes(), err
	}
}

// dumpMaps lists the pinned maps under dir: type, sizes and entries in use
// of the hash-like ones (counted by iterating their keys).
func dumpMaps(dir string) ([]byte, error) {
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PIN\tTYPE\tKEY\tVALUE\tMAX\tENTRIES")
	n := 0
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		m, err := ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			return nil // a pinned program or link
		}
		defer m.Close()
		n++
		entries := "-"
		switch m.Type() {
		case ebpf.Hash, ebpf.LRUHash, ebpf.PerCPUHash, ebpf.LRUCPUHash, ebpf.LPMTrie:
			var k []byte
			count := 0
			it := m.Iterate()
			var v []byte
			if m.Type() == ebpf.PerCPUHash || m.Type() == ebpf.LRUCPUHash {
				var pv [][]byte
				for it.Next(&k, &pv) {
					count++
				}
			} else {
				for it.Next(&k, &v) {
					count++
				}
			}
			entries = fmt.Sprint(count)
			if err := it.Err(); err != nil {
				entries += " (" + err.Error() + ")"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\n", rel, m.Type(), m.KeySize(), m.ValueSize(), m.MaxEntries(), entries)
		return nil
	})
	tw.Flush()
	if err == nil && n == 0 {
		err = fmt.Errorf("no pinned maps under %s", dir)
	}
	return b.Bytes(), err
}

// dumpLogs reads the tail of every log matching the globs: file name →
// content; a glob that matches nothing or a file that cannot be read
// becomes NAME.error.
func dumpLogs(globs []string, keep int64) map[string][]byte {
	out := map[string][]byte{}
	found := false
	for _, g := range globs {
		paths, _ := filepath.Glob(g)
		for _, p := range paths {
			name := strings.ReplaceAll(strings.TrimPrefix(p, "/"), "/", "_")
			data, err := tailFile(p, keep)
			if err != nil {
				out[name+".error"] = []byte(err.Error() + "\n")
				continue
			}
			found = true
			out[name] = data
		}
	}
	if !found {
		out["agent-logs.error"] = []byte(fmt.Sprintf("no agent log found in %s (on a node without the DaemonSet, pass --log; with journald: journalctl -u lanekitd)\n", strings.Join(globs, ", ")))
	}
	return out
}

func tailFile(path string, keep int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() > keep {
		if _, err := f.Seek(st.Size()-keep, io.SeekStart); err != nil {
			return nil, err
		}
	}
	return io.ReadAll(f)
}
