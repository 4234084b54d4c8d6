//! A comparable description of a captured graph, for the capture-determinism check.
//!
//! The check captures the body twice and compares the two recordings node by node: kind,
//! kernel function, launch dimensions, every kernel argument's bytes, copy and memset
//! sizes, directions and addresses, and the edges. A difference means the body's recorded
//! work depends on host state that changed between the two runs.
//!
//! Addresses of temporaries differ between two captures (each capture's allocation nodes
//! get their own addresses), so any 8-byte value (argument or copy endpoint) that points
//! into the `k`-th temporary of its graph is compared as "temporary `k` + offset".

use std::collections::HashMap;

use cudarc::driver::sys;

use crate::driver;
use crate::error::GraphError;

/// An address as the comparison sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Addr {
    /// Inside the `k`-th temporary (allocation node) of the graph, at this offset.
    Temp(usize, u64),
    /// Anything else, compared as is.
    Raw(u64),
}

/// One node, normalised.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    Kernel {
        name: String,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared: u32,
        /// Each argument: an address inside a temporary, or raw bytes.
        args: Vec<Arg>,
    },
    Copy {
        bytes: usize,
        src: Addr,
        dst: Addr,
    },
    Memset {
        dst: Addr,
        value: u32,
        element: u32,
        width: usize,
        height: usize,
    },
    Alloc {
        bytes: usize,
    },
    Free {
        addr: Addr,
    },
    Other(u32),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Arg {
    Temp(usize, u64),
    Bytes(Vec<u8>),
}

/// A normalised graph: its nodes in creation order and its edges by node index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fingerprint {
    nodes: Vec<Node>,
    edges: Vec<(usize, usize, u8)>,
}

impl Fingerprint {
    /// Reads `graph` from the driver, leaving out its first `skip` nodes (the input copies the
    /// runtime records ahead of the body, so that node numbers are the body's own).
    ///
    /// # Safety
    /// `graph` is a live graph of the context bound to this thread, whose kernels' modules
    /// are loaded.
    pub(crate) unsafe fn of(graph: sys::CUgraph, skip: usize) -> Result<Self, GraphError> {
        // SAFETY: forwarded from the caller for this and every node below.
        let handles = unsafe { driver::graph_nodes(graph) }?;
        let mut kinds = Vec::with_capacity(handles.len());
        let mut temps: Vec<(u64, u64)> = Vec::new();
        for &n in &handles {
            // SAFETY: `n` belongs to the live graph.
            let kind = unsafe { driver::node_type(n) }?;
            if kind == sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC {
                // SAFETY: `n` is an allocation node of the live graph.
                let p = unsafe { driver::mem_alloc_node_params(n) }?;
                temps.push((p.dptr, p.bytesize as u64));
            }
            kinds.push(kind);
        }
        let addr = |v: u64| -> Addr {
            temps
                .iter()
                .position(|&(start, len)| v >= start && v < start + len.max(1))
                .map_or(Addr::Raw(v), |k| Addr::Temp(k, v - temps[k].0))
        };
        let mut nodes = Vec::with_capacity(handles.len());
        let mut next_temp = 0usize;
        for (&n, &kind) in handles.iter().zip(&kinds) {
            use sys::CUgraphNodeType as T;
            nodes.push(match kind {
                T::CU_GRAPH_NODE_TYPE_KERNEL => {
                    // SAFETY: `n` is a kernel node of the live graph.
                    let p = unsafe { driver::kernel_node_params(n) }?;
                    // SAFETY: the node's function is live while its module is loaded.
                    let name = unsafe { driver::function_name(p.func) }.unwrap_or_default();
                    let mut args = Vec::new();
                    if !p.kernelParams.is_null() {
                        // SAFETY: the function is live; the sizes come from the driver.
                        let sizes = unsafe { driver::kernel_param_sizes(p.func) };
                        for (i, size) in sizes.into_iter().enumerate() {
                            // SAFETY: `kernelParams` holds one pointer per parameter, each to
                            // `size` bytes the graph keeps for as long as it lives.
                            let bytes = unsafe {
                                let arg = *p.kernelParams.add(i) as *const u8;
                                std::slice::from_raw_parts(arg, size).to_vec()
                            };
                            args.push(match <[u8; 8]>::try_from(bytes.as_slice()) {
                                Ok(word) => match addr(u64::from_ne_bytes(word)) {
                                    Addr::Temp(k, off) => Arg::Temp(k, off),
                                    Addr::Raw(_) => Arg::Bytes(bytes),
                                },
                                Err(_) => Arg::Bytes(bytes),
                            });
                        }
                    }
                    Node::Kernel {
                        name,
                        grid: (p.gridDimX, p.gridDimY, p.gridDimZ),
                        block: (p.blockDimX, p.blockDimY, p.blockDimZ),
                        shared: p.sharedMemBytes,
                        args,
                    }
                }
                T::CU_GRAPH_NODE_TYPE_MEMCPY => {
                    // SAFETY: `n` is a memcpy node of the live graph.
                    let p = unsafe { driver::memcpy_node_params(n) }?;
                    let end = |device: u64, host: usize| {
                        if device != 0 {
                            addr(device)
                        } else {
                            Addr::Raw(host as u64)
                        }
                    };
                    Node::Copy {
                        bytes: p.WidthInBytes * p.Height.max(1) * p.Depth.max(1),
                        src: end(p.srcDevice, p.srcHost as usize),
                        dst: end(p.dstDevice, p.dstHost as usize),
                    }
                }
                T::CU_GRAPH_NODE_TYPE_MEMSET => {
                    // SAFETY: `n` is a memset node of the live graph.
                    let p = unsafe { driver::memset_node_params(n) }?;
                    Node::Memset {
                        dst: addr(p.dst),
                        value: p.value,
                        element: p.elementSize,
                        width: p.width,
                        height: p.height,
                    }
                }
                T::CU_GRAPH_NODE_TYPE_MEM_ALLOC => {
                    let bytes = temps[next_temp].1 as usize;
                    next_temp += 1;
                    Node::Alloc { bytes }
                }
                T::CU_GRAPH_NODE_TYPE_MEM_FREE => {
                    // SAFETY: `n` is a free node of the live graph.
                    let ptr = unsafe { driver::mem_free_node_ptr(n) }?;
                    Node::Free { addr: addr(ptr) }
                }
                other => Node::Other(other as u32),
            });
        }
        let index: HashMap<usize, usize> = handles
            .iter()
            .enumerate()
            .map(|(i, &h)| (h as usize, i))
            .collect();
        // SAFETY: `graph` is live.
        let mut edges: Vec<(usize, usize, u8)> = unsafe { driver::graph_edges(graph) }?
            .into_iter()
            .filter_map(|(f, t, d)| {
                let (f, t) = (*index.get(&(f as usize))?, *index.get(&(t as usize))?);
                (f >= skip && t >= skip).then(|| (f - skip, t - skip, d.type_))
            })
            .collect();
        edges.sort_unstable();
        nodes.drain(..skip.min(nodes.len()));
        Ok(Fingerprint { nodes, edges })
    }

    /// The first difference between two recordings, in words, or `None` when they match.
    pub(crate) fn first_difference(&self, other: &Fingerprint) -> Option<String> {
        for (i, (a, b)) in self.nodes.iter().zip(&other.nodes).enumerate() {
            if a != b {
                return Some(format!(
                    "node {i} is {} in the first capture and {} in the second",
                    describe(a, b),
                    describe(b, a)
                ));
            }
        }
        if self.nodes.len() != other.nodes.len() {
            let (n, m) = (self.nodes.len(), other.nodes.len());
            let extra = if n > m {
                &self.nodes[m]
            } else {
                &other.nodes[n]
            };
            return Some(format!(
                "the first capture has {n} nodes and the second {m}; the first extra one is {}",
                describe(extra, extra)
            ));
        }
        if self.edges != other.edges {
            let k = self
                .edges
                .iter()
                .zip(&other.edges)
                .position(|(a, b)| a != b)
                .unwrap_or(self.edges.len().min(other.edges.len()));
            let show = |e: Option<&(usize, usize, u8)>| {
                e.map_or("nothing".to_owned(), |(f, t, _)| {
                    format!("node {f} → node {t}")
                })
            };
            return Some(format!(
                "the nodes match but their order does not: edge {k} is {} in the first capture and {} in \
                 the second",
                show(self.edges.get(k)),
                show(other.edges.get(k))
            ));
        }
        None
    }
}

/// `a` in words, detailed where it differs from `b`.
fn describe(a: &Node, b: &Node) -> String {
    match (a, b) {
        (
            Node::Kernel {
                name,
                grid,
                block,
                args,
                ..
            },
            Node::Kernel {
                name: n2,
                grid: g2,
                block: b2,
                args: a2,
                ..
            },
        ) if name == n2 => {
            if grid != g2 || block != b2 {
                format!("kernel `{name}` with grid {grid:?} and block {block:?}")
            } else {
                let k = args
                    .iter()
                    .zip(a2)
                    .position(|(x, y)| x != y)
                    .unwrap_or(args.len().min(a2.len()));
                let arg = args.get(k).map_or("missing".to_owned(), |a| match a {
                    Arg::Temp(t, off) => format!("temporary {t} + {off}"),
                    Arg::Bytes(b) => format!("{b:02x?}"),
                });
                format!("kernel `{name}` with argument {k} = {arg}")
            }
        }
        (Node::Kernel { name, .. }, _) => format!("kernel `{name}`"),
        (Node::Copy { bytes, src, dst }, _) => {
            format!(
                "a copy of {} from {src:?} to {dst:?}",
                crate::error::bytes(*bytes)
            )
        }
        (Node::Memset { dst, width, .. }, _) => format!("a memset of {width} elements at {dst:?}"),
        (Node::Alloc { bytes }, _) => format!("an allocation of {}", crate::error::bytes(*bytes)),
        (Node::Free { addr }, _) => format!("a free of {addr:?}"),
        (Node::Other(t), _) => format!("a node of type {t}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel(name: &str, arg: u8) -> Node {
        Node::Kernel {
            name: name.into(),
            grid: (1, 1, 1),
            block: (32, 1, 1),
            shared: 0,
            args: vec![Arg::Bytes(vec![arg; 4]), Arg::Temp(0, 16)],
        }
    }

    #[test]
    fn differences_are_named() {
        let a = Fingerprint {
            nodes: vec![kernel("add", 1), kernel("tanh", 2)],
            edges: vec![(0, 1, 0)],
        };
        assert_eq!(a.first_difference(&a.clone()), None);

        let mut b = a.clone();
        b.nodes[1] = kernel("tanh", 3);
        let d = a.first_difference(&b).unwrap();
        assert!(
            d.contains("node 1") && d.contains("`tanh` with argument 0"),
            "{d}"
        );

        let mut c = a.clone();
        c.nodes[0] = kernel("mul", 1);
        let d = a.first_difference(&c).unwrap();
        assert!(
            d.contains("kernel `add`") && d.contains("kernel `mul`"),
            "{d}"
        );

        let mut e = a.clone();
        e.nodes.push(Node::Alloc { bytes: 2048 });
        let d = a.first_difference(&e).unwrap();
        assert!(
            d.contains("2 nodes and the second 3") && d.contains("2.0 KiB"),
            "{d}"
        );

        let mut f = a.clone();
        f.edges = vec![(1, 0, 0)];
        assert!(a.first_difference(&f).unwrap().contains("order"));
    }
}
