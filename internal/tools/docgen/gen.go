package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"
)

// The generated blocks of docs/configuration.md: everything between
// "<!-- BEGIN GENERATED: name -->" and "<!-- END GENERATED: name -->" is
// replaced; the prose around them is kept.
const (
	blockAgentFlags = "lanekitd-flags"
	blockConfigMap  = "configmap-keys"
	blockCNIConfig  = "cni-config"
)

// The generated files (paths in the repository) and docs/lab.md's blocks.
const (
	configurationFile = "docs/configuration.md"
	labFile           = "docs/lab.md"
	blockLabUp        = "lab-up-flags"
	blockLabBench     = "lab-bench-flags"
)

// cobraFlag matches a flag line of a cobra command's help:
// "  -h, --help         help" or "      --nodes int   number of nodes (default 2)".
var cobraFlag = regexp.MustCompile(`^\s+(?:-\w, )?--([A-Za-z0-9][A-Za-z0-9-]*)(?: (\w+))?\s{2,}(.*)$`)

// parseCobraFlags reads the "Flags:" section of a cobra --help (--help
// itself left out).
func parseCobraFlags(help string) ([]flagDoc, error) {
	var flags []flagDoc
	in := false
	for _, line := range strings.Split(help, "\n") {
		switch {
		case line == "Flags:":
			in = true
			continue
		case !in:
			continue
		case strings.TrimSpace(line) == "":
			in = false
			continue
		}
		m := cobraFlag.FindStringSubmatch(line)
		if m == nil {
			return nil, fmt.Errorf("unrecognised flag line: %q", line)
		}
		if m[1] == "help" {
			continue
		}
		f := flagDoc{Name: m[1], Type: m[2], Usage: strings.TrimSpace(m[3])}
		if f.Type == "" {
			f.Type = "bool"
		}
		flags = append(flags, withDefault(f))
	}
	if len(flags) == 0 {
		return nil, errors.New("no flags in the --help output")
	}
	return flags, nil
}

// flagDoc is one flag of a Go flag.FlagSet as its --help prints it.
type flagDoc struct {
	Name, Type, Default, Usage string
}

// helpFlag matches a flag's first line in flag.PrintDefaults output:
// "  -name type" (usage on the next lines) or "  -x\tusage".
var helpFlag = regexp.MustCompile(`^  -([A-Za-z0-9][A-Za-z0-9._-]*)(?: ([^\t]+))?(?:\t(.*))?$`)

// helpDefault is the "(default ...)" flag.PrintDefaults appends to a usage.
var helpDefault = regexp.MustCompile(`\s*\(default (.*)\)$`)

// parseHelp reads the flags out of a Go program's --help output
// (flag.PrintDefaults' format). It fails on output it does not recognise,
// so that a changed format cannot produce an empty reference.
func parseHelp(help string) ([]flagDoc, error) {
	var flags []flagDoc
	sc := bufio.NewScanner(strings.NewReader(help))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "Usage of "), strings.TrimSpace(line) == "":
		case strings.HasPrefix(line, "    \t"):
			if len(flags) == 0 {
				return nil, fmt.Errorf("usage line before any flag: %q", line)
			}
			f := &flags[len(flags)-1]
			f.Usage = strings.TrimSpace(f.Usage + " " + strings.TrimPrefix(line, "    \t"))
		default:
			m := helpFlag.FindStringSubmatch(line)
			if m == nil {
				return nil, fmt.Errorf("unrecognised --help line: %q", line)
			}
			typ := m[2]
			if typ == "" {
				typ = "bool"
			}
			flags = append(flags, flagDoc{Name: m[1], Type: typ, Usage: m[3]})
		}
	}
	if len(flags) == 0 {
		return nil, errors.New("no flags in the --help output")
	}
	for i := range flags {
		flags[i] = withDefault(flags[i])
	}
	return flags, nil
}

// withDefault moves the "(default X)" the flag packages append to a usage
// into Default: X is quoted for a string, else one word. A "(default ...)"
// with words in it is the usage's own prose and stays there.
func withDefault(f flagDoc) flagDoc {
	m := helpDefault.FindStringSubmatchIndex(f.Usage)
	if m == nil {
		return f
	}
	def := f.Usage[m[2]:m[3]]
	if u, err := strconv.Unquote(def); err == nil {
		def = u
	} else if strings.Contains(def, " ") {
		return f
	}
	f.Default = def
	f.Usage = strings.TrimSpace(f.Usage[:m[0]])
	return f
}

// cell makes text safe inside a markdown table cell.
func cell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.ReplaceAll(s, "\n", " ")
}

// code wraps s as inline code (empty stays empty).
func code(s string) string {
	if s == "" {
		return ""
	}
	return "`" + s + "`"
}

// renderFlags is the lanekitd flag table.
func renderFlags(flags []flagDoc) string {
	var b strings.Builder
	b.WriteString("| flag | type | default | description |\n|---|---|---|---|\n")
	for _, f := range flags {
		fmt.Fprintf(&b, "| `--%s` | %s | %s | %s |\n", f.Name, f.Type, cell(code(f.Default)), cell(f.Usage))
	}
	return b.String()
}

// cmKey is one key of the ConfigMap's data.
type cmKey struct {
	Key, Value, Comment string
}

// parseConfigMapData reads deploy/configmap.yaml's data keys with their
// values and the comments written above them (a comment block belongs to
// the key right below it) or beside them. sigs.k8s.io/yaml drops comments,
// so this reads the lines; the values are checked against the decoded
// ConfigMap by the caller.
func parseConfigMapData(src []byte) ([]cmKey, error) {
	var (
		keys    []cmKey
		inData  bool
		pending []string
		keyLine = regexp.MustCompile(`^  ([A-Za-z0-9._-]+):(?: (.*))?$`)
	)
	for _, line := range strings.Split(string(src), "\n") {
		if line == "data:" {
			inData = true
			continue
		}
		if !inData || strings.HasPrefix(line, "    ") {
			continue // not in data, or a block scalar's body
		}
		if line != "" && !strings.HasPrefix(line, " ") {
			inData = false // the next top-level key
			continue
		}
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") {
			pending = append(pending, strings.TrimSpace(strings.TrimPrefix(trimmed, "#")))
			continue
		}
		m := keyLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		value, comment, _ := strings.Cut(m[2], " #")
		value = strings.Trim(strings.TrimSpace(value), `"`)
		if value == "|" {
			value = "" // a block scalar: shown elsewhere
		}
		// A key's own comment beside it says what it is; a block above
		// such a key introduces the section (and the prose says that).
		k := cmKey{Key: m[1], Value: value, Comment: strings.Join(pending, " ")}
		if c := strings.TrimSpace(comment); c != "" {
			k.Comment = c
		}
		keys = append(keys, k)
		pending = nil
	}
	if len(keys) == 0 {
		return nil, errors.New("no data keys found")
	}
	return keys, nil
}

// configMapFlags maps ConfigMap keys to the lanekitd flags the DaemonSet
// passes them to: an env var from a configMapKeyRef, referenced as $(VAR)
// in a --flag=... argument of the agent container.
func configMapFlags(daemonSet []byte, configMap string) (map[string][]string, error) {
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(daemonSet, &ds); err != nil {
		return nil, fmt.Errorf("decode DaemonSet: %w", err)
	}
	out := map[string][]string{}
	for _, c := range ds.Spec.Template.Spec.Containers {
		envKey := map[string]string{}
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil && e.ValueFrom.ConfigMapKeyRef.Name == configMap {
				envKey[e.Name] = e.ValueFrom.ConfigMapKeyRef.Key
			}
		}
		for _, a := range c.Args {
			name, val, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
			if !ok || !strings.HasPrefix(a, "--") {
				continue
			}
			for env, key := range envKey {
				if strings.Contains(val, "$("+env+")") {
					out[key] = append(out[key], "--"+name)
				}
			}
		}
	}
	for k := range out {
		sort.Strings(out[k])
	}
	return out, nil
}

// renderConfigMap is the ConfigMap key table.
func renderConfigMap(keys []cmKey, flags map[string][]string) string {
	var b strings.Builder
	b.WriteString("| key | shipped value | lanekitd flag | description |\n|---|---|---|---|\n")
	for _, k := range keys {
		value := code(k.Value)
		if k.Value == "" {
			value = `""`
		}
		var fl []string
		for _, f := range flags[k.Key] {
			fl = append(fl, code(f))
		}
		flag := strings.Join(fl, ", ")
		if flag == "" {
			flag = "—"
		}
		comment := k.Comment
		if comment == "" {
			comment = "(see the row above)"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", k.Key, cell(value), flag, cell(comment))
	}
	return b.String()
}

// cniField is one JSON field of the CNI plugin's network configuration.
type cniField struct {
	Path, Type, Doc string
}

// cniFields lists the JSON fields of pkg/cniplugin's NetConf (its own, not
// the embedded types.PluginConf the CNI spec defines) with their doc
// comments, descending into the plugin's own struct types. A field without
// a doc comment is an error: the reference must say what each one does.
func cniFields(src string) ([]cniField, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, src, nil, parser.ParseComments)
	if err != nil {
		return nil, err
	}
	structs := map[string]*ast.StructType{}
	ast.Inspect(f, func(n ast.Node) bool {
		if ts, ok := n.(*ast.TypeSpec); ok {
			if st, ok := ts.Type.(*ast.StructType); ok {
				structs[ts.Name.Name] = st
			}
		}
		return true
	})
	root, ok := structs["NetConf"]
	if !ok {
		return nil, fmt.Errorf("%s: no NetConf struct", src)
	}
	var out []cniField
	var walk func(prefix string, st *ast.StructType) error
	walk = func(prefix string, st *ast.StructType) error {
		for _, fld := range st.Fields.List {
			if len(fld.Names) == 0 || fld.Tag == nil {
				continue // embedded (types.PluginConf) or not JSON
			}
			tag := reflect.StructTag(strings.Trim(fld.Tag.Value, "`")).Get("json")
			name, _, _ := strings.Cut(tag, ",")
			if name == "" || name == "-" {
				continue
			}
			typ := exprString(fld.Type)
			doc := fieldDoc(fld.Names[0].Name, fld.Doc.Text())
			path := prefix + name
			if doc == "" {
				return fmt.Errorf("%s: field %s (%q) has no doc comment", src, fld.Names[0].Name, path)
			}
			inner := strings.TrimPrefix(typ, "*")
			sub, isStruct := structs[inner]
			if isStruct {
				typ = "object"
			}
			out = append(out, cniField{Path: path, Type: typ, Doc: doc})
			if isStruct {
				if err := walk(path+".", sub); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk("", root); err != nil {
		return nil, err
	}
	return out, nil
}

// fieldDoc is a field's doc comment on one line, without the Go
// convention's leading field name ("MTU is the ..." -> "The ...").
func fieldDoc(name, text string) string {
	doc := strings.Join(strings.Fields(text), " ")
	for _, p := range []string{name + " is ", name + ": ", name + " "} {
		if rest, ok := strings.CutPrefix(doc, p); ok && rest != "" {
			return strings.ToUpper(rest[:1]) + rest[1:]
		}
	}
	return doc
}

// exprString prints a field's type as written (*string, int, ...).
func exprString(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.Ident:
		return t.Name
	case *ast.StarExpr:
		return "*" + exprString(t.X)
	case *ast.SelectorExpr:
		return exprString(t.X) + "." + t.Sel.Name
	case *ast.ArrayType:
		return "[]" + exprString(t.Elt)
	case *ast.MapType:
		return "map[" + exprString(t.Key) + "]" + exprString(t.Value)
	}
	return fmt.Sprintf("%T", e)
}

// jsonType names a Go field type the way a JSON config reads.
func jsonType(goType string) string {
	switch strings.TrimPrefix(goType, "*") {
	case "string":
		return "string"
	case "int", "int32", "int64", "uint", "uint16", "uint32", "uint64":
		return "number"
	case "bool":
		return "boolean"
	}
	return goType
}

// renderCNI is the CNI config field table.
func renderCNI(fields []cniField) string {
	var b strings.Builder
	b.WriteString("| field | type | description |\n|---|---|---|\n")
	for _, f := range fields {
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", f.Path, jsonType(f.Type), cell(f.Doc))
	}
	return b.String()
}

// sources is what the reference is generated from.
type sources struct {
	AgentHelp string // lanekitd --help
	ConfigMap []byte // deploy/configmap.yaml
	DaemonSet []byte // deploy/daemonset.yaml
	CNISource string // path of pkg/cniplugin/cniplugin.go
}

// readSources reads the repository's files (the agent's help is passed in:
// it comes from running the built agent).
func readSources(root, agentHelp string) (sources, error) {
	cm, err := os.ReadFile(filepath.Join(root, "deploy", "configmap.yaml"))
	if err != nil {
		return sources{}, err
	}
	ds, err := os.ReadFile(filepath.Join(root, "deploy", "daemonset.yaml"))
	if err != nil {
		return sources{}, err
	}
	return sources{AgentHelp: agentHelp, ConfigMap: cm, DaemonSet: ds,
		CNISource: filepath.Join(root, "pkg", "cniplugin", "cniplugin.go")}, nil
}

// blocks renders every generated block.
func blocks(s sources) (map[string]string, error) {
	flags, err := parseHelp(s.AgentHelp)
	if err != nil {
		return nil, fmt.Errorf("lanekitd --help: %w", err)
	}
	keys, err := parseConfigMapData(s.ConfigMap)
	if err != nil {
		return nil, fmt.Errorf("deploy/configmap.yaml: %w", err)
	}
	var decoded struct {
		Metadata struct{ Name string } `json:"metadata"`
		Data     map[string]string     `json:"data"`
	}
	if err := yaml.Unmarshal(s.ConfigMap, &decoded); err != nil {
		return nil, fmt.Errorf("deploy/configmap.yaml: %w", err)
	}
	if len(decoded.Data) != len(keys) {
		return nil, fmt.Errorf("deploy/configmap.yaml: read %d keys by line, the YAML has %d", len(keys), len(decoded.Data))
	}
	for _, k := range keys {
		v, ok := decoded.Data[k.Key]
		if !ok || (k.Value != "" && v != k.Value) {
			return nil, fmt.Errorf("deploy/configmap.yaml: key %s read as %q, the YAML says %q", k.Key, k.Value, v)
		}
	}
	cmFlags, err := configMapFlags(s.DaemonSet, decoded.Metadata.Name)
	if err != nil {
		return nil, fmt.Errorf("deploy/daemonset.yaml: %w", err)
	}
	known := map[string]bool{}
	for _, f := range flags {
		known["--"+f.Name] = true
	}
	for key, fl := range cmFlags {
		for _, f := range fl {
			if !known[f] {
				return nil, fmt.Errorf("deploy/daemonset.yaml: ConfigMap key %s goes to %s, which lanekitd does not have", key, f)
			}
		}
	}
	fields, err := cniFields(s.CNISource)
	if err != nil {
		return nil, err
	}
	return map[string]string{
		blockAgentFlags: renderFlags(flags),
		blockConfigMap:  renderConfigMap(keys, cmFlags),
		blockCNIConfig:  renderCNI(fields),
	}, nil
}

// splice replaces each generated block of doc (the file named file) with
// its new content. Every block must be present exactly once.
func splice(file string, doc []byte, content map[string]string) ([]byte, error) {
	out := doc
	names := make([]string, 0, len(content))
	for name := range content {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		begin := []byte("<!-- BEGIN GENERATED: " + name + " -->\n")
		end := []byte("<!-- END GENERATED: " + name + " -->")
		i := bytes.Index(out, begin)
		j := bytes.Index(out, end)
		if i < 0 || j < i || bytes.Count(out, begin) != 1 {
			return nil, fmt.Errorf("%s: want one %q ... %q block", file, strings.TrimSpace(string(begin)), end)
		}
		var b bytes.Buffer
		b.Write(out[:i+len(begin)])
		b.WriteString("<!-- Generated by `make docs` (internal/tools/docgen); do not edit. -->\n\n")
		b.WriteString(content[name])
		b.WriteString("\n")
		b.Write(out[j:])
		out = b.Bytes()
	}
	return out, nil
}
