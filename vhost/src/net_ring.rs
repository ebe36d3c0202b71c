//! The split ring's fast path: the common case without a guest-memory lookup per access.
//!
//! At the start of a queue run, [`ring`] takes the guest memory's regions into a small
//! table ([`Regions`]: at most [`MAX_REGIONS`], looked up with a last-hit check instead of
//! vm-memory's search per access) and resolves the descriptor table, the avail ring and the used
//! ring to volatile slices of their region once. The table is rebuilt every run from the memory
//! the run holds, so a new memory table (`SET_MEM_TABLE`, `ADD_MEM_REG`, ...) is picked up at the
//! next run, and a slice never outlives the memory it points into (its lifetime is the run's
//! borrow of that memory).
//!
//! [`Ring::next`] serves only the plain case: one descriptor (no NEXT, no INDIRECT), the
//! direction the queue needs, a non-zero length, inside one region, its head below the queue
//! size, the available index at most the queue size ahead. Anything else is
//! [`Next::Checked`]: the caller takes that chain through virtio-queue and `collect`, the checked
//! path that counts and refuses malformed chains. Used elements are queued and written into the
//! used ring's slice up to 64 at a time, and the used index is published once per run
//! ([`Ring::publish`]).
//!
//! All guest memory access goes through vm-memory's `VolatileSlice` (atomic loads and stores of
//! single aligned fields for the rings, volatile copies for the frames, bounds checked on every
//! access, dirty bitmap honoured): no `unsafe` here. The guest may change anything at any time;
//! every value read is used once, after its check, from our copy.

use std::sync::atomic::Ordering;

use virtio_bindings::virtio_ring::{VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::{Queue, QueueT};
use vm_memory::bitmap::BS;

use super::{FastRing, Stats};
use vm_memory::{
    Bytes, GuestAddress, GuestMemory, GuestMemoryBackend, GuestMemoryRegion, MemoryRegionAddress, VolatileSlice,
};

/// Regions kept in the table; guest memory with more regions takes the checked path.
pub const MAX_REGIONS: usize = 8;

/// A volatile slice of guest memory in region type `R`.
pub type Slice<'a, R> = VolatileSlice<'a, BS<'a, <R as GuestMemoryRegion>::B>>;

/// The region type of a `GuestMemory`.
pub type RegionOf<M> = <<M as GuestMemory>::PhysicalMemory as GuestMemoryBackend>::R;

/// The guest memory regions of one run: start, length and the region, for `[start, start+len)`.
pub struct Regions<'a, R: GuestMemoryRegion> {
    start: [u64; MAX_REGIONS],
    len: [u64; MAX_REGIONS],
    region: [Option<&'a R>; MAX_REGIONS],
    n: usize,
    last: usize,
}

/// The regions of `mem`; None behind an IOMMU (no plain physical memory) or with more than
/// [`MAX_REGIONS`] regions.
pub fn regions<M: GuestMemory>(mem: &M) -> Option<Regions<'_, RegionOf<M>>> {
    let phys = mem.physical_memory()?;
    let mut t = Regions { start: [0; MAX_REGIONS], len: [0; MAX_REGIONS], region: [None; MAX_REGIONS], n: 0, last: 0 };
    for r in phys.iter() {
        if t.n == MAX_REGIONS {
            return None;
        }
        t.start[t.n] = r.start_addr().0;
        t.len[t.n] = r.len();
        t.region[t.n] = Some(r);
        t.n += 1;
    }
    Some(t)
}

impl<'a, R: GuestMemoryRegion> Regions<'a, R> {
    /// `len` bytes at guest address `addr` when they lie in one region.
    #[inline]
    pub fn slice(&mut self, addr: u64, len: usize) -> Option<Slice<'a, R>> {
        let hit = |i: usize| addr.wrapping_sub(self.start[i]) < self.len[i];
        let i = if self.last < self.n && hit(self.last) { self.last } else { (0..self.n).find(|&i| hit(i))? };
        self.last = i;
        let off = addr - self.start[i];
        // get_slice checks that off + len stays inside the region.
        self.region[i]?.get_slice(MemoryRegionAddress(off), len).ok()
    }
}

/// What the next available chain is.
pub enum Next<'a, R: GuestMemoryRegion> {
    /// A single descriptor that passed every check: its head, guest address and buffer.
    Simple {
        /// Head (descriptor) index.
        head: u16,
        /// Guest address of the buffer.
        addr: GuestAddress,
        /// The buffer.
        buf: Slice<'a, R>,
    },
    /// Nothing available, or something the checked path must look at.
    Checked,
}

/// The rings of one queue, resolved for one run.
pub struct Ring<'a, R: GuestMemoryRegion> {
    /// The memory regions (also used for the frames' buffers).
    pub regions: Regions<'a, R>,
    desc: Slice<'a, R>,
    avail: Slice<'a, R>,
    used: Slice<'a, R>,
    size: u16,
    avail_idx: u16,
    /// Used elements not yet written (`npending` of them, for used indexes from `first`).
    pending: [u8; 8 * USED_BATCH],
    npending: usize,
    first: u16,
}

/// Used elements queued before they are written.
const USED_BATCH: usize = 64;

/// Resolve the rings of `q`; None (use the checked path for everything) when the queue is not
/// ready, a ring does not lie in one region or its indexes cannot be accessed atomically.
pub fn ring<'a, M: GuestMemory>(q: &Queue, mem: &'a M) -> Option<Ring<'a, RegionOf<M>>> {
    let size = q.size();
    if !q.ready() || size == 0 {
        return None;
    }
    let mut regions = regions(mem)?;
    let n = usize::from(size);
    let desc = regions.slice(q.desc_table(), 16 * n)?;
    let avail = regions.slice(q.avail_ring(), 4 + 2 * n)?;
    let used = regions.slice(q.used_ring(), 4 + 8 * n)?;
    // These loads check the alignment every later access relies on (descriptors 8, used
    // elements 4, indexes 2); a misaligned ring takes the checked path.
    desc.load::<u64>(0, Ordering::Relaxed).ok()?;
    used.load::<u32>(4, Ordering::Relaxed).ok()?;
    let avail_idx = u16::from_le(avail.load::<u16>(2, Ordering::Acquire).ok()?);
    Some(Ring { regions, desc, avail, used, size, avail_idx, pending: [0; 8 * USED_BATCH], npending: 0, first: 0 })
}

impl<'a, R: GuestMemoryRegion> Ring<'a, R> {
    /// Check the next available chain (at `q.next_avail()`) for the plain case, without taking
    /// it: the caller advances `next_avail` when it uses a [`Next::Simple`].
    #[inline]
    pub fn next(&mut self, q: &Queue, writable: bool) -> Next<'a, R> {
        let pos = q.next_avail();
        if pos == self.avail_idx {
            // Acquire: the ring entries and descriptors the driver published before the index.
            match self.avail.load::<u16>(2, Ordering::Acquire) {
                Ok(idx) => self.avail_idx = u16::from_le(idx),
                Err(_) => return Next::Checked,
            }
        }
        // Nothing new, or an index further ahead than the queue size (corrupt: the checked
        // path counts it).
        let ahead = self.avail_idx.wrapping_sub(pos);
        if ahead == 0 || ahead > self.size {
            return Next::Checked;
        }
        // Aligned single loads (checked in `ring`): one access per field, no copy routine.
        let slot = 4 + 2 * usize::from(pos % self.size);
        let Ok(head) = self.avail.load::<u16>(slot, Ordering::Relaxed).map(u16::from_le) else { return Next::Checked };
        if head >= self.size {
            return Next::Checked;
        }
        // struct virtq_desc { le64 addr; le32 len; le16 flags; le16 next; }
        let at = 16 * usize::from(head);
        let (Ok(addr), Ok(rest)) =
            (self.desc.load::<u64>(at, Ordering::Relaxed), self.desc.load::<u64>(at + 8, Ordering::Relaxed))
        else {
            return Next::Checked;
        };
        let (addr, rest) = (u64::from_le(addr), u64::from_le(rest));
        let (len, flags) = (rest as u32 as usize, (rest >> 32) as u16);
        if flags & (VRING_DESC_F_NEXT | VRING_DESC_F_INDIRECT) as u16 != 0
            || (flags & VRING_DESC_F_WRITE as u16 != 0) != writable
            || len == 0
        {
            return Next::Checked;
        }
        match self.regions.slice(addr, len) {
            Some(buf) => Next::Simple { head, addr: GuestAddress(addr), buf },
            None => Next::Checked,
        }
    }

    /// Queue used element `{head, len}` (`head` below the queue size) for `q.next_used()` and
    /// advance it. The element is written by [`Ring::flush`] (at the latest by
    /// [`Ring::publish`]), which must run before anything else publishes a used index.
    #[inline]
    pub fn push_used(&mut self, q: &mut Queue, head: u16, len: u32) -> Result<(), vm_memory::VolatileMemoryError> {
        if self.npending == USED_BATCH {
            self.flush()?;
        }
        let next = q.next_used();
        if self.npending == 0 {
            self.first = next;
        }
        // virtq_used_elem { le32 id; le32 len }
        self.pending[self.npending * 8..][..8].copy_from_slice(&(u64::from(head) | u64::from(len) << 32).to_le_bytes());
        self.npending += 1;
        q.set_next_used(next.wrapping_add(1));
        Ok(())
    }

    /// Write the queued used elements into the used ring: one copy per contiguous run of slots
    /// (two when the run wraps), not one access per element.
    pub fn flush(&mut self) -> Result<(), vm_memory::VolatileMemoryError> {
        let n = std::mem::take(&mut self.npending);
        let slot = usize::from(self.first % self.size);
        let k = n.min(usize::from(self.size) - slot);
        // After the 4-byte used ring header; `used` covers all `size` elements.
        self.used.write_slice(&self.pending[..8 * k], 4 + 8 * slot)?;
        self.used.write_slice(&self.pending[8 * k..8 * n], 4)
    }

    /// Write the queued elements, then publish `q.next_used()` as the used index (Release: the
    /// elements before the index that hands them to the driver).
    pub fn publish(&mut self, q: &Queue) -> Result<(), vm_memory::VolatileMemoryError> {
        self.flush()?;
        self.used.store(q.next_used().to_le(), 2, Ordering::Release)
    }
}

/// [`super::add_used`] through the fast path's used ring when there is one: the element is written, the
/// used index published at the end of the run ([`publish_used`]).
pub(super) fn add_used_fast<M: GuestMemory>(
    q: &mut Queue,
    mem: &M,
    ring: &mut FastRing<'_, M>,
    head: u16,
    len: usize,
    stats: &Stats,
) {
    let Some(r) = ring else { return super::add_used(q, mem, head, len, stats) };
    // A head outside the table yields an empty chain, already counted as an error; there is
    // no descriptor to give back.
    if head < q.size() {
        if let Err(e) = r.push_used(q, head, u32::try_from(len).unwrap_or(u32::MAX)) {
            stats.error(&vm_memory::GuestMemoryError::from(e));
        }
    }
}

/// Publish the used index after [`add_used_fast`] when it moved from `before`.
pub(super) fn publish_used<R: vm_memory::GuestMemoryRegion>(
    q: &Queue,
    ring: &mut Option<Ring<'_, R>>,
    before: u16,
    stats: &Stats,
) {
    let Some(r) = ring else { return };
    if q.next_used() == before {
        return;
    }
    if let Err(e) = r.publish(q) {
        stats.error(&vm_memory::GuestMemoryError::from(e));
    }
}

/// Ask the guest to kick when it adds its next RX buffer; true when it added some since its
/// index was read (look again). `enable_notification` arms `avail_event` at `next_avail`, which
/// is right when every posted buffer is used; but a packet that needs more buffers than are
/// posted (a 64 KiB GSO packet across mergeable buffers) leaves `next_avail` behind buffers the
/// guest has already posted, and with EVENT_IDX the guest kicks only when its index crosses
/// `avail_event`: it would never kick again, and the packet would wait for the next one to
/// arrive. So the event is put at the guest's current index, as QEMU's virtio-net does.
pub(super) fn arm_for_more<M: vm_memory::GuestMemory>(q: &mut Queue, mem: &M) -> Result<bool, virtio_queue::Error> {
    let pos = q.next_avail();
    let avail = q.avail_idx(mem, Ordering::Acquire)?;
    q.set_next_avail(avail.0);
    let more = q.enable_notification(mem);
    q.set_next_avail(pos);
    more
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::os::fd::RawFd;

    use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
    use virtio_queue::desc::{split::Descriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use virtio_queue::{Queue, QueueT};
    use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryMmap};

    use crate::net::{rx_queue, tx_queue, NetMode, RxState, Stats, TxState, HDR_LEN};
    use crate::port::{Batch, Port};

    /// Sends into `.0`, receives from `.1`.
    struct Sink(Vec<Vec<u8>>, Vec<Vec<u8>>);

    impl Port for Sink {
        fn recv(&mut self, batch: &mut Batch, max: usize) -> io::Result<usize> {
            let n = max.min(self.1.len());
            for f in self.1.drain(..n) {
                batch.push(&f);
            }
            Ok(n)
        }
        fn send(&mut self, batch: &Batch) -> io::Result<usize> {
            self.0.extend(batch.iter().map(<[u8]>::to_vec));
            Ok(batch.len())
        }
        fn fd(&self) -> RawFd {
            -1
        }
        fn describe(&self) -> String {
            "sink".into()
        }
    }

    /// Plain chains (fast path) interleaved with everything the fast path hands to the checked
    /// path: a buffer across two regions, a two-descriptor chain, an address outside memory, a
    /// wrong direction. Valid frames are sent in ring order, bad chains counted and returned,
    /// every head used once, in order, and the used index published.
    #[test]
    fn fast_and_checked_chains_interleave() {
        let (r0, r1) = (0x20_0000u64, 0x20_0000u64);
        let mem =
            GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), r0 as usize), (GuestAddress(r0), r1 as usize)])
                .unwrap();
        let vq = MockSplitQueue::new(&mem, 16);
        let frame = |tag: u8| -> Vec<u8> { (0..64).map(|i| tag.wrapping_add(i)).collect() };
        let put = |addr: u64, tag: u8| {
            let mut b = vec![0u8; HDR_LEN];
            b.extend(frame(tag));
            mem.write_slice(&b, GuestAddress(addr)).unwrap();
        };
        let d = |addr: u64, len: usize, flags: u32, next: u16| {
            RawDescriptor::from(Descriptor::new(addr, len as u32, flags as u16, next))
        };
        let n = (HDR_LEN + 64) as u32 as usize;
        put(0x10_0000, 1);
        put(r0 - 40, 2); // across the region boundary
        mem.write_slice(&[0u8; HDR_LEN], GuestAddress(0x10_1000)).unwrap();
        mem.write_slice(&frame(3), GuestAddress(0x10_2000)).unwrap();
        put(0x10_3000, 4);
        let descs = [
            d(0x10_0000, n, 0, 0),
            d(r0 - 40, n, 0, 0),
            d(0x10_1000, HDR_LEN, VRING_DESC_F_NEXT, 3),
            d(0x10_2000, 64, 0, 0),
            d(r0 + r1 - 8, n, 0, 0), // past the end of memory
            d(0x10_0000, n, VRING_DESC_F_WRITE, 0),
            d(0x10_3000, n, 0, 0),
        ];
        vq.add_desc_chains(&descs, 0).unwrap();
        let mut q: Queue = vq.create_queue().unwrap();
        // MockSplitQueue's used ring overlaps the avail ring's second half: move it.
        q.set_used_ring_address(Some(0x8000), Some(0));
        let (mut port, mut st, stats) = (Sink(Vec::new(), Vec::new()), TxState::default(), Stats::default());
        let mode = NetMode {
            hdr_len: HDR_LEN,
            mergeable: true,
            max_frame: 1518,
            hash_report: false,
            offloads: crate::offload::Offloads::NONE,
            rx_hash: None,
        };
        let run = tx_queue(&mut q, &mem, &mut port, &mut st, mode, &stats, 64);
        assert_eq!(run.handled, 6);
        assert_eq!(port.0, vec![frame(1), frame(2), frame(3), frame(4)]);
        assert_eq!(stats.snapshot().errors, 2);
        let used_idx: u16 = mem.read_obj(GuestAddress(0x8002)).unwrap();
        assert_eq!((used_idx, q.next_used(), q.next_avail()), (6, 6, 6));
        let heads: Vec<u32> = (0..6).map(|i| mem.read_obj(GuestAddress(0x8004 + 8 * i)).unwrap()).collect();
        assert_eq!(heads, vec![0, 1, 2, 4, 5, 6]);
    }

    /// RX runs longer than the used element batch, and a batch that wraps around the end of
    /// the used ring: every element lands in its slot, the used index covers them all.
    #[test]
    fn used_elements_batch_and_wrap() {
        const QS: u16 = 128;
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x40_0000)]).unwrap();
        let vq = MockSplitQueue::new(&mem, QS);
        let descs: Vec<_> = (0..100u64)
            .map(|i| RawDescriptor::from(Descriptor::new(0x10_0000 + i * 2048, 2048, VRING_DESC_F_WRITE as u16, 0)))
            .collect();
        vq.add_desc_chains(&descs, 0).unwrap();
        let mut q: Queue = vq.create_queue().unwrap();
        q.set_used_ring_address(Some(0x8000), Some(0));
        let avail = vq.avail_addr();
        let mode = NetMode {
            hdr_len: HDR_LEN,
            mergeable: true,
            max_frame: 1518,
            hash_report: false,
            offloads: crate::offload::Offloads::NONE,
            rx_hash: None,
        };
        let (mut st, stats) = (RxState::default(), Stats::default());
        for round in 0..2u16 {
            if round == 1 {
                // The guest gives all 100 buffers back: avail positions 100..199 (slots wrap).
                for i in 0..100u16 {
                    mem.write_obj(i, avail.unchecked_add(4 + 2 * u64::from((100 + i) % QS))).unwrap();
                }
                mem.write_obj(200u16, avail.unchecked_add(2)).unwrap();
            }
            let frames: Vec<Vec<u8>> = (0..100u8).map(|i| vec![i; 60 + usize::from(i)]).collect();
            let mut port = Sink(Vec::new(), frames);
            let run = rx_queue(&mut q, &mem, &mut port, &mut st, mode, &stats, 256);
            assert_eq!(run.handled, 100);
            let used_idx: u16 = mem.read_obj(GuestAddress(0x8002)).unwrap();
            assert_eq!(used_idx, 100 * (round + 1));
            for i in 0..100u16 {
                let slot = u64::from((100 * round + i) % QS);
                let elem: [u32; 2] = mem.read_obj(GuestAddress(0x8004 + 8 * slot)).unwrap();
                assert_eq!(elem, [u32::from(i), (HDR_LEN + 60) as u32 + u32::from(i)], "round {round} frame {i}");
            }
        }
        assert_eq!(stats.snapshot().errors, 0);
    }
}
