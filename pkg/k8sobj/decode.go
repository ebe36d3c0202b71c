// Package k8sobj decodes the Kubernetes objects lanekit translates — v1 Service,
// discovery.k8s.io/v1 EndpointSlice, networking.k8s.io/v1 NetworkPolicy, v1
// Namespace and v1 Pod — from
// multi-document YAML or a stream of JSON objects into the typed k8s.io/api structs,
// strictly (unknown or duplicate fields are errors) and validated for what lanekit's
// service and policy translation relies on.
//
// Decoding is all-or-nothing: a batch with one invalid document yields an error
// naming the document index, the object (kind namespace/name) and the field path,
// and no objects. The same decoder serves `lanekit service|policy apply -f` files;
// objects that arrive from the API server (already typed) go through Validate.
package k8sobj

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// Kind names an object kind.
type Kind string

// Kind names accepted by Decode.
const (
	KindService       Kind = "Service"
	KindEndpointSlice Kind = "EndpointSlice"
	KindNetworkPolicy Kind = "NetworkPolicy"
	// KindNamespace is cluster-scoped: its objects have no namespace.
	KindNamespace Kind = "Namespace"
	KindPod       Kind = "Pod"
	kindList           = "List"
)

// Kinds lists the supported kinds in the order an agent applies them.
var Kinds = []Kind{KindNamespace, KindPod, KindService, KindEndpointSlice, KindNetworkPolicy}

// ParseKind returns the Kind named s (case-insensitive).
func ParseKind(s string) (Kind, error) {
	for _, k := range Kinds {
		if strings.EqualFold(s, string(k)) {
			return k, nil
		}
	}
	return "", fmt.Errorf("kind %q is not supported (want Service, EndpointSlice, NetworkPolicy, Namespace or Pod)", s)
}

// Namespaced reports whether objects of kind k live in a namespace.
func (k Kind) Namespaced() bool { return k != KindNamespace }

// API versions accepted for each kind.
var apiVersions = map[Kind]string{
	KindService:       "v1",
	KindEndpointSlice: "discovery.k8s.io/v1",
	KindNetworkPolicy: "networking.k8s.io/v1",
	KindNamespace:     "v1",
	KindPod:           "v1",
}

// DefaultNamespace is the namespace of objects whose metadata.namespace is empty,
// as kubectl does for files.
const DefaultNamespace = "default"

// MaxDocumentBytes bounds one document, so a hostile file cannot make the agent
// allocate without limit.
const MaxDocumentBytes = 4 << 20

// Object is one decoded object. Exactly one of Service, EndpointSlice,
// NetworkPolicy, Namespace and Pod is set, matching Kind.
type Object struct {
	// Index is the 0-based index of the document in the input, counting
	// non-empty documents only (items of a List share their List's index).
	Index         int
	Kind          Kind
	Service       *Service       // what lanekit reads of a v1 Service (service.go)
	EndpointSlice *EndpointSlice // what lanekit reads of a v1 EndpointSlice (slice.go)
	NetworkPolicy *networkingv1.NetworkPolicy
	NamespaceObj  *corev1.Namespace // Kind Namespace (Namespace() is every kind's namespace accessor)
	Pod           *Pod              // what lanekit reads of a v1 Pod (pod.go)
}

// Namespace returns the object's namespace.
func (o Object) Namespace() string { ns, _ := o.nsName(); return ns }

// Name returns the object's name.
func (o Object) Name() string { _, n := o.nsName(); return n }

// String is "Kind namespace/name" ("Namespace name" for namespaces).
func (o Object) String() string { return describe(o.Kind, o.Namespace(), o.Name()) }

// Key identifies the object among all kinds: "Kind/namespace/name" (namespace
// empty for cluster-scoped kinds).
func (o Object) Key() string { return ObjectKey(o.Kind, o.Namespace(), o.Name()) }

// ObjectKey is Object.Key for a kind, namespace and name.
func ObjectKey(kind Kind, ns, name string) string { return string(kind) + "/" + ns + "/" + name }

func (o Object) nsName() (string, string) {
	switch {
	case o.Service != nil:
		return o.Service.Namespace, o.Service.Name
	case o.EndpointSlice != nil:
		return o.EndpointSlice.Namespace, o.EndpointSlice.Name
	case o.NetworkPolicy != nil:
		return o.NetworkPolicy.Namespace, o.NetworkPolicy.Name
	case o.NamespaceObj != nil:
		return "", o.NamespaceObj.Name
	case o.Pod != nil:
		return o.Pod.Namespace, o.Pod.Name
	}
	return "", ""
}

func describe(kind Kind, ns, name string) string {
	if kind == "" {
		kind = "object"
	}
	if name == "" {
		name = "<no name>"
	}
	if kind == KindNamespace {
		return fmt.Sprintf("%s %s", kind, name)
	}
	if ns == "" {
		ns = DefaultNamespace
	}
	return fmt.Sprintf("%s %s/%s", kind, ns, name)
}

// DocError is a decoding or validation error of one document.
type DocError struct {
	Index  int    // 0-based document index
	Object string // "Kind ns/name" as far as known
	Err    error
}

func (e *DocError) Error() string {
	return fmt.Sprintf("document %d (%s): %v", e.Index, e.Object, e.Err)
}

func (e *DocError) Unwrap() error { return e.Err }

// ErrUnsupported marks well-formed input lanekit does not implement.
var ErrUnsupported = errors.New("unsupported")

// Decode decodes and validates all documents in data. Empty documents are
// skipped; a `kind: List` document contributes its items. Any error rejects the
// whole batch.
func Decode(data []byte) ([]Object, error) {
	docs, err := splitDocuments(data)
	if err != nil {
		return nil, err
	}
	var out []Object
	for i, doc := range docs {
		objs, err := decodeDocument(i, doc)
		if err != nil {
			return nil, err
		}
		out = append(out, objs...)
	}
	if err := checkDuplicates(out); err != nil {
		return nil, err
	}
	return out, nil
}

// DecodeJSON decodes one JSON object as EncodeJSON writes it (the agent's
// store), strict and validated like Decode but without Decode's YAML step.
func DecodeJSON(js []byte) (Object, error) {
	return decodeOne(0, bytes.TrimSpace(js))
}

// DecodeReader reads r to the end and decodes it like Decode.
func DecodeReader(r io.Reader) ([]Object, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("read objects: %w", err)
	}
	return Decode(data)
}

// splitDocuments returns the raw documents: a stream of JSON values if the input
// starts with '{', otherwise YAML documents separated by "---".
func splitDocuments(data []byte) ([][]byte, error) {
	if utilyaml.IsJSONBuffer(data) {
		dec := json.NewDecoder(bytes.NewReader(data))
		var docs [][]byte
		for {
			var raw json.RawMessage
			if err := dec.Decode(&raw); err == io.EOF {
				return docs, nil
			} else if err != nil {
				return nil, &DocError{Index: len(docs), Err: fmt.Errorf("parse json: %w", err)}
			}
			if len(raw) > MaxDocumentBytes {
				return nil, &DocError{Index: len(docs), Err: fmt.Errorf("document larger than %d bytes", MaxDocumentBytes)}
			}
			docs = append(docs, raw)
		}
	}
	r := utilyaml.NewYAMLReader(bufio.NewReaderSize(bytes.NewReader(data), 4096))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if err == io.EOF {
			return docs, nil
		}
		if err != nil {
			return nil, &DocError{Index: len(docs), Err: fmt.Errorf("split yaml: %w", err)}
		}
		if len(doc) > MaxDocumentBytes {
			return nil, &DocError{Index: len(docs), Err: fmt.Errorf("document larger than %d bytes", MaxDocumentBytes)}
		}
		docs = append(docs, doc)
	}
}

type typeMeta struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
}

type list struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   map[string]any    `json:"metadata,omitempty"`
	Items      []json.RawMessage `json:"items"`
}

func isBlank(doc []byte) bool {
	for _, line := range strings.Split(string(doc), "\n") {
		l := strings.TrimSpace(line)
		if l != "" && !strings.HasPrefix(l, "#") && l != "---" {
			return false
		}
	}
	return true
}

func decodeDocument(index int, doc []byte) ([]Object, error) {
	if isBlank(doc) {
		return nil, nil
	}
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return nil, &DocError{Index: index, Object: "object", Err: fmt.Errorf("parse: %w", err)}
	}
	js = bytes.TrimSpace(js)
	if bytes.Equal(js, []byte("null")) {
		return nil, nil
	}
	var tm typeMeta
	if err := json.Unmarshal(js, &tm); err != nil {
		return nil, &DocError{Index: index, Object: "object", Err: fmt.Errorf("not an object: %w", err)}
	}
	what := describe(Kind(tm.Kind), tm.Metadata.Namespace, tm.Metadata.Name)
	if tm.Kind == kindList && tm.APIVersion == "v1" {
		var l list
		if err := strictUnmarshal(js, &l); err != nil {
			return nil, &DocError{Index: index, Object: what, Err: err}
		}
		var out []Object
		for i, item := range l.Items {
			o, err := decodeOne(index, item)
			if err != nil {
				var de *DocError
				if errors.As(err, &de) {
					de.Object = fmt.Sprintf("List item %d: %s", i, de.Object)
				}
				return nil, err
			}
			out = append(out, o)
		}
		return out, nil
	}
	o, err := decodeOne(index, js)
	if err != nil {
		return nil, err
	}
	return []Object{o}, nil
}

func decodeOne(index int, js []byte) (Object, error) {
	var tm typeMeta
	if err := json.Unmarshal(js, &tm); err != nil {
		return Object{}, &DocError{Index: index, Object: "object", Err: fmt.Errorf("not an object: %w", err)}
	}
	what := describe(Kind(tm.Kind), tm.Metadata.Namespace, tm.Metadata.Name)
	want, ok := apiVersions[Kind(tm.Kind)]
	if !ok {
		if tm.Kind == "" {
			return Object{}, &DocError{Index: index, Object: what, Err: errors.New("kind: Required value")}
		}
		return Object{}, &DocError{Index: index, Object: what, Err: fmt.Errorf(
			"kind %q is not supported (want Service, EndpointSlice, NetworkPolicy, Namespace or Pod)", tm.Kind)}
	}
	if tm.APIVersion != want {
		return Object{}, &DocError{Index: index, Object: what, Err: fmt.Errorf(
			"apiVersion %q is not supported for %s (want %q)", tm.APIVersion, tm.Kind, want)}
	}
	o := Object{Index: index, Kind: Kind(tm.Kind)}
	var target any
	switch o.Kind {
	case KindService:
		target = &corev1.Service{}
	case KindEndpointSlice:
		target = &discoveryv1.EndpointSlice{}
	case KindNetworkPolicy:
		o.NetworkPolicy = &networkingv1.NetworkPolicy{}
		target = o.NetworkPolicy
	case KindNamespace:
		o.NamespaceObj = &corev1.Namespace{}
		target = o.NamespaceObj
	case KindPod:
		target = &corev1.Pod{}
	}
	if err := strictUnmarshal(js, target); err != nil {
		return Object{}, &DocError{Index: index, Object: what, Err: err}
	}
	switch v := target.(type) {
	case *corev1.Service:
		o.Service = SlimService(v)
	case *corev1.Pod:
		o.Pod = SlimPod(v)
	case *discoveryv1.EndpointSlice:
		o.EndpointSlice = SlimEndpointSlice(v)
	}
	defaultNamespace(&o)
	if err := Validate(o); err != nil {
		return Object{}, &DocError{Index: index, Object: o.String(), Err: err}
	}
	return o, nil
}

// strictUnmarshal decodes js into v, rejecting unknown and duplicate fields with
// their paths.
func strictUnmarshal(js []byte, v any) error {
	strict, err := sigsjson.UnmarshalStrict(js, v)
	if err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	if len(strict) > 0 {
		msgs := make([]string, len(strict))
		for i, e := range strict {
			msgs[i] = e.Error()
		}
		return errors.New(strings.Join(msgs, "; "))
	}
	return nil
}

func defaultNamespace(o *Object) {
	switch {
	case o.Service != nil && o.Service.Namespace == "":
		o.Service.Namespace = DefaultNamespace
	case o.EndpointSlice != nil && o.EndpointSlice.Namespace == "":
		o.EndpointSlice.Namespace = DefaultNamespace
	case o.NetworkPolicy != nil && o.NetworkPolicy.Namespace == "":
		o.NetworkPolicy.Namespace = DefaultNamespace
	case o.Pod != nil && o.Pod.Namespace == "":
		o.Pod.Namespace = DefaultNamespace
	}
}

func checkDuplicates(objs []Object) error {
	seen := map[string]int{}
	for _, o := range objs {
		k := o.String()
		if prev, dup := seen[k]; dup {
			return &DocError{Index: o.Index, Object: k, Err: fmt.Errorf("duplicate of document %d", prev)}
		}
		seen[k] = o.Index
	}
	return nil
}

// Encode writes objs as multi-document YAML (with apiVersion and kind set), the
// inverse of Decode.
func Encode(objs []Object) ([]byte, error) {
	var buf bytes.Buffer
	for i, o := range objs {
		v, err := typed(o)
		if err != nil {
			return nil, fmt.Errorf("encode object %d: %w", i, err)
		}
		b, err := yaml.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("encode %s: %w", o, err)
		}
		if i > 0 {
			buf.WriteString("---\n")
		}
		buf.Write(b)
	}
	return buf.Bytes(), nil
}

// EncodeJSON returns o as one JSON document with apiVersion and kind set
// (Decode reads it back).
func EncodeJSON(o Object) ([]byte, error) {
	v, err := typed(o)
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", o, err)
	}
	return b, nil
}

// typed returns a shallow copy of o's object with its TypeMeta filled in:
// what it shares with o is only read (encoded), and a deep copy of each
// object a store transaction writes was most of what it allocated.
func typed(o Object) (any, error) {
	switch {
	case o.Service != nil:
		return o.Service.V1(), nil
	case o.EndpointSlice != nil:
		return o.EndpointSlice.V1(), nil
	case o.NetworkPolicy != nil:
		c := *o.NetworkPolicy
		c.APIVersion, c.Kind = apiVersions[KindNetworkPolicy], string(KindNetworkPolicy)
		return &c, nil
	case o.NamespaceObj != nil:
		c := *o.NamespaceObj
		c.APIVersion, c.Kind = apiVersions[KindNamespace], string(KindNamespace)
		return &c, nil
	case o.Pod != nil:
		return o.Pod.V1(), nil
	}
	return nil, errors.New("empty object")
}

// Check validates an object built in code (not decoded): exactly one object
// set, matching Kind, and Validate. Decode does the same for files.
func Check(o Object) error {
	n := 0
	var k Kind
	for _, x := range []struct {
		set  bool
		kind Kind
	}{{o.Service != nil, KindService}, {o.EndpointSlice != nil, KindEndpointSlice}, {o.NetworkPolicy != nil, KindNetworkPolicy},
		{o.NamespaceObj != nil, KindNamespace}, {o.Pod != nil, KindPod}} {
		if x.set {
			n++
			k = x.kind
		}
	}
	switch {
	case n == 0:
		return fmt.Errorf("%s: empty object", describe(o.Kind, "", ""))
	case n > 1:
		return fmt.Errorf("%s: more than one object set", o)
	case o.Kind != "" && o.Kind != k:
		return fmt.Errorf("%s: kind %q does not match the object (a %s)", o, o.Kind, k)
	}
	return Validate(o)
}

// Split sorts decoded Services, EndpointSlices and NetworkPolicies by kind,
// keeping their order (other kinds are left out).
func Split(objs []Object) (svcs []*Service, slices []*EndpointSlice, policies []*networkingv1.NetworkPolicy) {
	for _, o := range objs {
		switch {
		case o.Service != nil:
			svcs = append(svcs, o.Service)
		case o.EndpointSlice != nil:
			slices = append(slices, o.EndpointSlice)
		case o.NetworkPolicy != nil:
			policies = append(policies, o.NetworkPolicy)
		}
	}
	return svcs, slices, policies
}
