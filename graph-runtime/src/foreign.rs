//! Memory a graph addresses but does not hold, checked before every replay.
//!
//! A graph's kernels keep the addresses they were captured with. What the graph holds (its
//! static buffers, its state, its temporaries, the runtime) cannot be freed while it lives;
//! a framework's own buffers can. candle keeps one grow-only workspace per device for its
//! quantized matmuls: an eager quantized call larger than any before it allocates a bigger
//! workspace and frees the old one, which the graph's kernels still write. Nothing of the
//! graph's own changes, so no other check sees it, and the next replays write into whatever
//! was allocated there since.
//!
//! So at instantiation every address a node carries (each 8-byte word of a kernel's
//! arguments, each copy and memset endpoint) that lies outside the graph's temporaries and
//! that CUDA knows as allocated memory is looked up: its allocation's start, size and buffer
//! ID. The driver gives every allocation an ID of its own for the life of the process, so a
//! buffer freed and allocated again at the same address has another ID. Allocations the
//! graph's state or static inputs cover are left out (their owners are checked or held
//! already); before every replay each remaining allocation's ID is read again (one driver
//! query each, nothing allocated), and a missing or different one is
//! [`GraphError::ForeignMemoryMoved`]: nothing is launched, and every later replay of the
//! graph is refused the same way until it is captured again.

use std::collections::HashMap;

use cudarc::driver::sys;

use crate::driver;
use crate::error::GraphError;

/// One allocation the graph addresses and does not hold.
#[derive(Debug)]
struct Held {
    /// The allocation's first address and size at capture.
    start: u64,
    bytes: u64,
    /// Its buffer ID at capture.
    id: u64,
    /// The address the graph carries, and the node that carries it.
    address: u64,
    node: String,
}

/// The allocations a graph addresses and does not hold (see the module's documentation).
#[derive(Debug, Default)]
pub(crate) struct Foreign {
    held: Vec<Held>,
}

/// Gathers the addresses a graph's nodes carry, while its nodes are read.
#[derive(Debug, Default)]
pub(crate) struct Addresses {
    /// Each address once, with the index of the first node name that carried it.
    seen: HashMap<u64, usize>,
    nodes: Vec<String>,
}

/// The lowest and highest value taken for an address: below 64 KiB are small integers, and
/// no 64-bit process maps memory at or above 2^57.
const ADDRESSES: std::ops::Range<u64> = 0x1_0000..1 << 57;

impl Addresses {
    /// Every 8-byte word of the arguments of the kernel node `node` (a kernel whose
    /// parameters the driver cannot describe adds nothing).
    ///
    /// # Safety
    /// `node` is a kernel node of a live graph whose modules are loaded.
    pub(crate) unsafe fn kernel(&mut self, node: sys::CUgraphNode) -> Result<(), GraphError> {
        // SAFETY: forwarded from the caller.
        let k = unsafe { driver::kernel_node(node) }?;
        let words = k.args.iter().flat_map(|bytes| {
            bytes
                .chunks_exact(8)
                .map(bytemuck::pod_read_unaligned::<u64>)
        });
        let name = k.name;
        self.add(words, || format!("kernel `{name}`"));
        Ok(())
    }

    /// The endpoints of a copy or memset node (`what` names it for the error).
    pub(crate) fn endpoints(&mut self, addresses: &[u64], what: &'static str) {
        self.add(addresses.iter().copied(), || what.to_string());
    }

    fn add(&mut self, words: impl IntoIterator<Item = u64>, node: impl FnOnce() -> String) {
        let index = self.nodes.len();
        let mut used = false;
        for w in words {
            if ADDRESSES.contains(&w) {
                self.seen.entry(w).or_insert_with(|| {
                    used = true;
                    index
                });
            }
        }
        if used {
            self.nodes.push(node());
        }
    }

    /// The allocations behind the gathered addresses that none of `temps` (the graph's
    /// temporaries, address and size) contains.
    pub(crate) fn resolve(self, temps: &[(u64, u64)]) -> Foreign {
        let inside = |v: u64| temps.iter().any(|&(s, n)| v >= s && v < s + n.max(1));
        let mut by_id: HashMap<u64, Held> = HashMap::new();
        let mut seen: Vec<(u64, usize)> = self.seen.into_iter().collect();
        seen.sort_unstable();
        for (address, node) in seen {
            if inside(address) {
                continue;
            }
            if let Some((id, start, bytes)) = driver::allocation_of(address) {
                by_id.entry(id).or_insert_with(|| Held {
                    start,
                    bytes,
                    id,
                    address,
                    node: self.nodes[node].clone(),
                });
            }
        }
        let mut held: Vec<Held> = by_id.into_values().collect();
        held.sort_unstable_by_key(|h| h.start);
        Foreign { held }
    }
}

impl Foreign {
    /// Leaves out the allocations that overlap one of `regions` (address, bytes): memory the
    /// graph's state or static buffers hold.
    pub(crate) fn exempt(&mut self, regions: impl IntoIterator<Item = (u64, u64)>) {
        let regions: Vec<(u64, u64)> = regions.into_iter().filter(|r| r.1 > 0).collect();
        self.held.retain(|h| {
            !regions
                .iter()
                .any(|&(s, n)| s < h.start + h.bytes && h.start < s + n)
        });
    }

    /// How many allocations are checked before each replay.
    pub(crate) fn len(&self) -> usize {
        self.held.len()
    }

    /// Whether every allocation still has the buffer ID it had at capture.
    #[inline]
    pub(crate) fn check(&self, graph: &'static str) -> Result<(), GraphError> {
        match self
            .held
            .iter()
            .find(|h| driver::buffer_id(h.start) != Some(h.id))
        {
            None => Ok(()),
            Some(h) => Err(GraphError::ForeignMemoryMoved {
                graph,
                node: h.node.clone(),
                address: h.address,
                bytes: h.bytes as usize,
            }),
        }
    }
}
