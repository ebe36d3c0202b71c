package service

import (
	"fmt"
	"testing"
)

func TestMaglevSize(t *testing.T) {
	tests := []struct{ n, want int }{
		{0, 251}, {1, 251}, {2, 251}, {3, 401}, {4, 401}, {5, 809}, {8, 809},
		{9, 1601}, {16, 1601}, {17, 3203}, {100, 12809}, {1000, 102407},
	}
	for _, tt := range tests {
		got := MaglevSize(tt.n)
		if got != tt.want {
			t.Errorf("MaglevSize(%d) = %d, want %d", tt.n, got, tt.want)
		}
		if !isPrime(got) || got < MaglevPerBackend*tt.n {
			t.Errorf("MaglevSize(%d) = %d: not a prime ≥ 100×n", tt.n, got)
		}
	}
}

func TestIsPrime(t *testing.T) {
	primes := map[int]bool{2: true, 3: true, 5: true, 7: true, 251: true, 401: true}
	for n := 0; n <= 401; n++ {
		want := primes[n]
		if n > 7 && n != 251 && n != 401 {
			want = trialPrime(n)
		}
		if isPrime(n) != want {
			t.Errorf("isPrime(%d) = %v", n, !want)
		}
	}
}

func trialPrime(n int) bool {
	for d := 2; d < n; d++ {
		if n%d == 0 {
			return false
		}
	}
	return n >= 2
}

func keysN(n int) []string {
	k := make([]string, n)
	for i := range k {
		k[i] = fmt.Sprintf("10.244.%d.%d:8080/TCP", i/250, i%250+1)
	}
	return k
}

// TestMaglevBalance: every backend gets ⌊M/n⌋ or ⌈M/n⌉ slots, so its share is
// within 1 % of 1/n for M ≥ 100 n.
func TestMaglevBalance(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5, 7, 10, 16, 33, 100, 257} {
		m := MaglevSize(n)
		table := Maglev(keysN(n), m)
		if len(table) != m {
			t.Fatalf("n=%d: table size %d, want %d", n, len(table), m)
		}
		count := make([]int, n)
		for _, b := range table {
			if b < 0 || int(b) >= n {
				t.Fatalf("n=%d: slot holds %d", n, b)
			}
			count[b]++
		}
		lo, hi := m/n, (m+n-1)/n
		for i, c := range count {
			if c < lo || c > hi {
				t.Errorf("n=%d m=%d: backend %d has %d slots, want %d..%d", n, m, i, c, lo, hi)
			}
			share := float64(c) / float64(m)
			if d := share - 1/float64(n); d > 0.01/float64(n) || d < -0.01/float64(n) {
				t.Errorf("n=%d: backend %d share %.5f, want within 1%% of %.5f", n, i, share, 1/float64(n))
			}
		}
	}
}

// TestMaglevDeterministic: the table depends only on the keys — pinned golden
// values guard against a per-process seed or an algorithm change (every node
// must build the same table).
func TestMaglevDeterministic(t *testing.T) {
	a := Maglev(keysN(5), MaglevSize(5))
	b := Maglev(keysN(5), MaglevSize(5))
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("slot %d differs between two builds", i)
		}
	}
	got := fmt.Sprint(a[:16])
	const want = "[0 2 3 1 0 0 1 1 4 0 1 0 4 3 1 1]"
	if got != want {
		t.Errorf("first slots %s, want %s (table changed: every node must agree)", got, want)
	}
}

// TestMaglevPermutation: the paper's permutation visits every slot once
// (offset/skip with prime M); a table with one backend is all that backend.
func TestMaglevPermutation(t *testing.T) {
	m := 251
	h1, h2 := maglevHashes("x")
	off, skip := h1%uint64(m), h2%uint64(m-1)+1
	seen := make([]bool, m)
	for j := 0; j < m; j++ {
		c := (off + uint64(j)*skip) % uint64(m)
		if seen[c] {
			t.Fatalf("slot %d visited twice", c)
		}
		seen[c] = true
	}
	for _, b := range Maglev([]string{"only"}, m) {
		if b != 0 {
			t.Fatal("single-backend table has another backend")
		}
	}
	if Maglev(nil, m) != nil {
		t.Fatal("empty backend set must give no table")
	}
}

// disruption returns, for removing backend r of n (same table size), the slots
// that moved although they did not belong to r, and r's own slot count.
func disruption(n, r int) (extra, own int) {
	keys := keysN(n)
	m := MaglevSize(n)
	before := Maglev(keys, m)
	rest := append(append([]string{}, keys[:r]...), keys[r+1:]...)
	after := Maglev(rest, m)
	for i := range before {
		if int(before[i]) == r {
			own++
			continue
		}
		if keys[before[i]] != rest[after[i]] {
			extra++
		}
	}
	return extra, own
}

// TestMaglevMinimalDisruption: removing one backend moves all of its slots and
// only a small number of others. The Maglev paper (§3.4, §5.3 Fig. 12) shows the
// extra disruption empirically rather than as a closed bound; at 100 slots per
// backend we measure ~1.5 % of the table moving beyond the removed
// backend's own slots (n ≤ 100) and up to ~2.6 % (n = 200), and assert ≤ 3 % of
// M over many removals. (Relative to the removed backend's own ~M/n slots the
// extra grows with n: ~1× at n = 30, ~2.7× at n = 200.)
func TestMaglevMinimalDisruption(t *testing.T) {
	worst, worstRatio := 0.0, 0.0
	for _, n := range []int{6, 7, 12, 13, 30, 60, 100, 200} {
		m := MaglevSize(n)
		for r := 0; r < n; r += max(1, n/7) {
			extra, own := disruption(n, r)
			frac := float64(extra) / float64(m)
			worst = max(worst, frac)
			if frac > 0.03 {
				t.Errorf("n=%d remove %d: %d of %d other slots moved (%.2f%%), bound 3%%", n, r, extra, m, 100*frac)
			}
			worstRatio = max(worstRatio, float64(extra)/float64(own))
			if own < m/n || own > m/n+1 {
				t.Errorf("n=%d remove %d: removed backend had %d slots", n, r, own)
			}
		}
	}
	t.Logf("worst extra disruption: %.2f%% of the table, %.2f× the removed backend's own slots", 100*worst, worstRatio)
}
