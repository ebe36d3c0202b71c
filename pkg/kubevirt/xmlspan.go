package kubevirt

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
)

// element is one XML element of a document and where it sits in the raw
// bytes, so edits can splice the original text and leave everything else
// byte-for-byte as it was.
type element struct {
	name     string // as written, with any prefix ("qemu:commandline")
	attrs    []xml.Attr
	start    int // offset of '<' of the start tag
	tagEnd   int // offset just after the start tag's '>'
	end      int // offset just after the end tag (== tagEnd when self-closing)
	selfEnd  bool
	children []*element
	parent   *element
}

func (e *element) attr(name string) (string, bool) {
	for _, a := range e.attrs {
		if qname(a.Name) == name {
			return a.Value, true
		}
	}
	return "", false
}

func (e *element) child(name string) *element {
	for _, c := range e.children {
		if c.name == name {
			return c
		}
	}
	return nil
}

func (e *element) all(name string) []*element {
	var out []*element
	for _, c := range e.children {
		if c.name == name {
			out = append(out, c)
		}
	}
	return out
}

func qname(n xml.Name) string {
	if n.Space != "" {
		return n.Space + ":" + n.Local
	}
	return n.Local
}

// parseSpans reads doc into an element tree with byte offsets. RawToken keeps
// prefixes as written; start and end tags are matched here.
func parseSpans(doc []byte) (*element, error) {
	d := xml.NewDecoder(bytes.NewReader(doc))
	d.Strict = true
	var root *element
	var stack []*element
	for {
		off := int(d.InputOffset())
		tok, err := d.RawToken()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("malformed domain xml: %w", err)
		}
		switch t := tok.(type) {
		case xml.StartElement:
			e := &element{name: qname(t.Name), attrs: t.Attr, start: off, tagEnd: int(d.InputOffset())}
			if len(stack) > 0 {
				p := stack[len(stack)-1]
				e.parent = p
				p.children = append(p.children, e)
			} else if root != nil {
				return nil, fmt.Errorf("malformed domain xml: second root element <%s> at offset %d", e.name, off)
			} else {
				root = e
			}
			stack = append(stack, e)
		case xml.EndElement:
			if len(stack) == 0 {
				return nil, fmt.Errorf("malformed domain xml: unexpected </%s> at offset %d", qname(t.Name), off)
			}
			e := stack[len(stack)-1]
			if qname(t.Name) != e.name {
				return nil, fmt.Errorf("malformed domain xml: </%s> closes <%s> at offset %d", qname(t.Name), e.name, off)
			}
			e.end = int(d.InputOffset())
			e.selfEnd = e.end == e.tagEnd
			stack = stack[:len(stack)-1]
		}
	}
	if root == nil {
		return nil, fmt.Errorf("malformed domain xml: no root element")
	}
	if len(stack) > 0 {
		return nil, fmt.Errorf("malformed domain xml: <%s> is never closed", stack[len(stack)-1].name)
	}
	return root, nil
}

// splice is one edit: replace doc[start:end] with text.
type splice struct {
	start, end int
	text       string
}

func applySplices(doc []byte, edits []splice) ([]byte, error) {
	sort.SliceStable(edits, func(i, j int) bool { return edits[i].start < edits[j].start })
	var out bytes.Buffer
	pos := 0
	for _, e := range edits {
		if e.start < pos {
			return nil, fmt.Errorf("overlapping edits at offset %d", e.start)
		}
		out.Write(doc[pos:e.start])
		out.WriteString(e.text)
		pos = e.end
	}
	out.Write(doc[pos:])
	return out.Bytes(), nil
}

// layout is how a document is indented, so inserted elements look like
// their neighbours (virt-launcher marshals with one tab per level).
type layout struct {
	doc    []byte
	pretty bool
	unit   string
}

func newLayout(doc []byte, root *element) layout {
	l := layout{doc: doc, unit: "\t"}
	if len(root.children) > 0 {
		ind, ok := l.lineIndent(root.children[0])
		l.pretty = ok
		if ok && ind != "" {
			l.unit = ind
		}
	}
	return l
}

// lineIndent returns the whitespace between the line start and e, and
// whether e starts its own line.
func (l layout) lineIndent(e *element) (string, bool) {
	i := e.start
	for i > 0 && (l.doc[i-1] == ' ' || l.doc[i-1] == '\t') {
		i--
	}
	if i > 0 && l.doc[i-1] == '\n' {
		return string(l.doc[i:e.start]), true
	}
	return "", false
}

func (l layout) indentOf(e *element) string {
	if e.parent == nil {
		return ""
	}
	if ind, ok := l.lineIndent(e); ok {
		return ind
	}
	return l.indentOf(e.parent) + l.unit
}

func (l layout) childIndent(p *element) string {
	if len(p.children) > 0 {
		return l.indentOf(p.children[0])
	}
	return l.indentOf(p) + l.unit
}

// nl starts a new line at indent ind (nothing in a compact document).
func (l layout) nl(ind string) string {
	if !l.pretty {
		return ""
	}
	return "\n" + ind
}

// appendChildren returns the edit that adds text (already laid out for the
// child indent, each element preceded by nl) as p's last children.
func (l layout) appendChildren(p *element, text string) splice {
	if p.selfEnd {
		// <p a="b"/> -> <p a="b">TEXT\n</p>
		open := strings.TrimSuffix(strings.TrimSpace(string(l.doc[p.start:p.tagEnd-2])), "/")
		return splice{p.start, p.end, open + ">" + text + l.nl(l.indentOf(p)) + "</" + p.name + ">"}
	}
	if len(p.children) > 0 {
		last := p.children[len(p.children)-1]
		return splice{last.end, last.end, text}
	}
	// <p></p> or <p>\n</p>: replace the inside.
	closeAt := bytes.LastIndex(l.doc[p.tagEnd:p.end], []byte("</")) + p.tagEnd
	return splice{p.tagEnd, closeAt, text + l.nl(l.indentOf(p))}
}

func attrEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch r {
		case '&':
			b.WriteString("&amp;")
		case '<':
			b.WriteString("&lt;")
		case '>':
			b.WriteString("&gt;")
		case '"':
			b.WriteString("&quot;")
		case '\'':
			b.WriteString("&apos;")
		case '\n':
			b.WriteString("&#xA;")
		case '\t':
			b.WriteString("&#x9;")
		case '\r':
			b.WriteString("&#xD;")
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}
