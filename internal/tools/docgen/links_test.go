package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// mdLink is an inline markdown link or image: [text](target) / ![alt](target).
var mdLink = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// inlineCode is a `code` span: links inside one are text.
var inlineCode = regexp.MustCompile("`[^`]*`")

// mdAnchors returns the anchors GitHub makes for a markdown file's
// headings: lower case, punctuation dropped, spaces to hyphens, a repeated
// heading suffixed -1, -2, ...
func mdAnchors(text string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	fence := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "```") {
			fence = !fence
			continue
		}
		if fence || !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.TrimLeft(line, "#")
		if !strings.HasPrefix(h, " ") {
			continue
		}
		a := slug(h)
		if n := seen[a]; n > 0 {
			anchors[a+"-"+strconv.Itoa(n)] = true
		} else {
			anchors[a] = true
		}
		seen[a]++
	}
	return anchors
}

func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127 && isLetter(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func isLetter(r rune) bool { return strings.ToUpper(string(r)) != strings.ToLower(string(r)) }

// mdLinks returns the link targets of a markdown text outside code blocks
// and code spans.
func mdLinks(text string) []string {
	var out []string
	fence := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fence = !fence
			continue
		}
		if fence || strings.HasPrefix(line, "    ") && strings.TrimSpace(line) != "" && !strings.HasPrefix(strings.TrimSpace(line), "-") && !strings.HasPrefix(strings.TrimSpace(line), "|") {
			continue // fenced or indented code
		}
		line = inlineCode.ReplaceAllString(line, "")
		out = append(out, mdLinks1(line)...)
	}
	return out
}

func mdLinks1(line string) []string {
	var out []string
	for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
		out = append(out, m[1])
	}
	return out
}

// brokenLinks checks every relative link of the markdown file at path
// (inside root): the file it names exists, and a #fragment of a markdown
// file is one of its headings.
func brokenLinks(root, path string) ([]string, error) {
	text, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var broken []string
	for _, target := range mdLinks(string(text)) {
		if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
			continue
		}
		file, frag, _ := strings.Cut(target, "#")
		dest := path
		if file != "" {
			dest = filepath.Join(filepath.Dir(path), file)
		}
		rel, err := filepath.Rel(root, dest)
		if err != nil || strings.HasPrefix(rel, "..") {
			broken = append(broken, target+" (outside the repository)")
			continue
		}
		if _, err := os.Stat(dest); err != nil {
			broken = append(broken, target+" (no such file)")
			continue
		}
		if frag == "" || !strings.HasSuffix(dest, ".md") {
			continue
		}
		destText, err := os.ReadFile(dest)
		if err != nil {
			return nil, err
		}
		if !mdAnchors(string(destText))[frag] {
			broken = append(broken, target+" (no such heading)")
		}
	}
	return broken, nil
}

// TestRelativeLinks fails on any relative link in README.md and docs/*.md
// that points to a missing file or heading.
func TestRelativeLinks(t *testing.T) {
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append([]string{filepath.Join(root, "README.md")}, files...)
	checked := 0
	for _, f := range files {
		broken, err := brokenLinks(root, f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, f)
		for _, b := range broken {
			t.Errorf("%s: broken link %s", rel, b)
		}
		checked++
	}
	if checked < 2 {
		t.Fatalf("checked %d files", checked)
	}
}

func TestBrokenLinksFound(t *testing.T) {
	root := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("docs/b.md", "# B\n\n## Host/DPU split\n\n## Host/DPU split\n")
	a := write("docs/a.md", "# A title\n\n[ok](b.md#hostdpu-split) [dup](b.md#hostdpu-split-1) [self](#a-title) ![img](b.md)\n"+
		"[gone](c.md) [bad](b.md#nope) [up](../../x.md) `[code](nope.md)`\n```\n[fenced](nope.md)\n```\n")
	broken, err := brokenLinks(root, a)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"c.md (no such file)", "b.md#nope (no such heading)", "../../x.md (outside the repository)"}
	if strings.Join(broken, "; ") != strings.Join(want, "; ") {
		t.Fatalf("got %q, want %q", broken, want)
	}
}
