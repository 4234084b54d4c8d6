//! A comparable description of a captured graph, for the capture-determinism check.
//!
//! The check captures the body twice and compares the two recordings node by node: kind,
//! kernel function, launch dimensions, every kernel argument's bytes, copy and memset
//! sizes, directions and addresses, conditional nodes with their bodies, and the edges. A
//! difference means the body's recorded work depends on host state that changed between the
//! two runs.
//!
//! Addresses of temporaries differ between two captures (each capture's allocation nodes
//! get their own addresses), so any 8-byte value (an argument, an 8-byte word of a larger
//! argument, or a copy endpoint) that points into the `k`-th temporary of its graph (or of a
//! graph enclosing a conditional body) is compared as "temporary `k` + offset". Conditional
//! handles differ between captures too: a word equal to the `k`-th handle the capture created
//! is compared as "handle `k`".
//!
//! A kernel the body did not look up itself (a cuBLAS or cuBLASLt kernel, a candle kernel)
//! may carry host addresses among its arguments: cuBLASLt's split-K reduce kernel takes the
//! address of a scale factor on the calling thread's stack, unused when the scale is passed
//! by value, and in a debug build that address moves with the call depth between two
//! captures. In such a kernel a word that CUDA does not know as memory and that lies in the
//! user-space address range is compared as "a host address", not by its value; in the body's
//! own kernels (looked up through `Runtime::function`) every word counts.

use std::collections::HashMap;

use cudarc::driver::sys;

use crate::conditional::record::CaptureRecord;
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
        /// Each argument: 8-byte words (addresses inside temporaries and handles
        /// normalised), or raw bytes for other sizes.
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
    /// A conditional node of one of the capture's `graph_while` / `graph_if`.
    Conditional {
        kind: u32,
        bodies: Vec<Fingerprint>,
    },
    Other(u32),
}

/// One 8-byte word of a kernel argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Word {
    Temp(usize, u64),
    Handle(usize),
    /// A host address in a library kernel's argument (see the module docs).
    Host,
    Raw(u64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Arg {
    Words(Vec<Word>),
    Bytes(Vec<u8>),
}

/// A normalised graph: its nodes in creation order and its edges by node index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fingerprint {
    nodes: Vec<Node>,
    edges: Vec<(usize, usize, u8)>,
}

/// What the words of a graph are compared against: the temporaries of the graph and of the
/// graphs enclosing it, and the capture's conditional handles.
struct Names<'a> {
    temps: Vec<(u64, u64)>,
    handles: &'a [u64],
    record: &'a CaptureRecord,
    /// The kernels the body looked up itself (`Runtime::function`): their words all count.
    own: &'a [String],
}

/// Whether `v` can be a host address: in the canonical user-space range of a 64-bit
/// process (above the first 64 KiB, below 2^47) and unknown to CUDA as memory.
fn host_address(v: u64) -> bool {
    (0x1_0000..1 << 47).contains(&v) && driver::pointer_memory_type(v).is_none()
}

impl Names<'_> {
    fn addr(&self, v: u64) -> Addr {
        self.temps
            .iter()
            .position(|&(start, len)| v >= start && v < start + len.max(1))
            .map_or(Addr::Raw(v), |k| Addr::Temp(k, v - self.temps[k].0))
    }

    /// A word of an argument of kernel `kernel`.
    fn word(&self, v: u64, kernel: &str) -> Word {
        match self.addr(v) {
            Addr::Temp(k, off) => Word::Temp(k, off),
            Addr::Raw(_) => match self.handles.iter().position(|&h| h == v) {
                Some(k) => Word::Handle(k),
                None if !self.own.iter().any(|o| o == kernel) && host_address(v) => Word::Host,
                None => Word::Raw(v),
            },
        }
    }
}

impl Fingerprint {
    /// Reads `graph` from the driver, leaving out its first `skip` nodes (the input copies the
    /// runtime records ahead of the body, so that node numbers are the body's own). `record`
    /// holds the capture's conditional nodes and handles; `own` names the kernels the body
    /// looked up itself; `earlier` holds the temporaries of the capture's segments before this
    /// one (a segment after an island reads and frees them), numbered before its own.
    ///
    /// # Safety
    /// `graph` is a live graph of the context bound to this thread, whose kernels' modules
    /// are loaded; `record` is the record of the capture that made it.
    pub(crate) unsafe fn of(
        graph: sys::CUgraph,
        skip: usize,
        record: &CaptureRecord,
        own: &[String],
        earlier: &[(u64, u64)],
    ) -> Result<Self, GraphError> {
        let handles = record.handles();
        let names = Names {
            temps: earlier.to_vec(),
            handles: &handles,
            record,
            own,
        };
        // SAFETY: forwarded from the caller.
        unsafe { Self::read(graph, skip, names) }
    }

    /// # Safety
    /// As for [`Fingerprint::of`]; `graph` is the capture's graph or one of its bodies.
    unsafe fn read(
        graph: sys::CUgraph,
        skip: usize,
        mut names: Names<'_>,
    ) -> Result<Self, GraphError> {
        // SAFETY: forwarded from the caller for this and every node below.
        let handles = unsafe { driver::graph_nodes(graph) }?;
        let mut kinds = Vec::with_capacity(handles.len());
        let first_temp = names.temps.len();
        for &n in &handles {
            // SAFETY: `n` belongs to the live graph.
            let kind = unsafe { driver::node_type(n) }?;
            if kind == sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC {
                // SAFETY: `n` is an allocation node of the live graph.
                let p = unsafe { driver::mem_alloc_node_params(n) }?;
                names.temps.push((p.dptr, p.bytesize as u64));
            }
            kinds.push(kind);
        }
        let mut nodes = Vec::with_capacity(handles.len());
        let mut next_temp = first_temp;
        for (&n, &kind) in handles.iter().zip(&kinds) {
            let node = if kind == sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC {
                let bytes = names.temps[next_temp].1 as usize;
                next_temp += 1;
                Node::Alloc { bytes }
            } else {
                // SAFETY: `n` is a node of the live graph, of type `kind`.
                unsafe { Self::node(n, kind, &names) }?
            };
            nodes.push(node);
        }
        // SAFETY: `graph` is live and `handles` are its nodes.
        let edges = unsafe { Self::edges(graph, &handles, skip) }?;
        nodes.drain(..skip.min(nodes.len()));
        Ok(Fingerprint { nodes, edges })
    }

    /// One node other than an allocation (whose size `read` takes from its list).
    ///
    /// # Safety
    /// `n` is a node of type `kind` of a live graph that [`Fingerprint::read`] may read.
    unsafe fn node(
        n: sys::CUgraphNode,
        kind: sys::CUgraphNodeType,
        names: &Names<'_>,
    ) -> Result<Node, GraphError> {
        use sys::CUgraphNodeType as T;
        Ok(match kind {
            // SAFETY: `n` is a kernel node of the live graph.
            T::CU_GRAPH_NODE_TYPE_KERNEL => unsafe { Self::kernel(n, names) }?,
            T::CU_GRAPH_NODE_TYPE_MEMCPY => {
                // SAFETY: `n` is a memcpy node of the live graph.
                let p = unsafe { driver::memcpy_node_params(n) }?;
                let end = |device: u64, host: usize| {
                    if device != 0 {
                        names.addr(device)
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
                    dst: names.addr(p.dst),
                    value: p.value,
                    element: p.elementSize,
                    width: p.width,
                    height: p.height,
                }
            }
            T::CU_GRAPH_NODE_TYPE_MEM_FREE => {
                // SAFETY: `n` is a free node of the live graph.
                let ptr = unsafe { driver::mem_free_node_ptr(n) }?;
                Node::Free {
                    addr: names.addr(ptr),
                }
            }
            T::CU_GRAPH_NODE_TYPE_CONDITIONAL => match names.record.node(n) {
                Some(cond) => {
                    let mut bodies = Vec::with_capacity(cond.bodies.len());
                    for &body in &cond.bodies {
                        let inner = Names {
                            temps: names.temps.clone(),
                            handles: names.handles,
                            record: names.record,
                            own: names.own,
                        };
                        // SAFETY: `body` is a body graph of a node of the live graph, made by
                        // the same capture.
                        bodies.push(unsafe { Self::read(body, 0, inner) }?);
                    }
                    Node::Conditional {
                        kind: cond.kind,
                        bodies,
                    }
                }
                None => Node::Other(kind as u32),
            },
            other => Node::Other(other as u32),
        })
    }

    /// A kernel node: its function's name, launch shape and parameters, word by word.
    ///
    /// # Safety
    /// `n` is a kernel node of a live graph whose modules are loaded.
    unsafe fn kernel(n: sys::CUgraphNode, names: &Names<'_>) -> Result<Node, GraphError> {
        // SAFETY: forwarded from the caller.
        let k = unsafe { driver::kernel_node(n) }?;
        let (p, name) = (k.params, k.name);
        let args = k
            .args
            .into_iter()
            .map(|bytes| {
                if !bytes.is_empty() && bytes.len() % 8 == 0 {
                    Arg::Words(
                        bytes
                            .chunks_exact(8)
                            .map(|w| names.word(bytemuck::pod_read_unaligned(w), &name))
                            .collect(),
                    )
                } else {
                    Arg::Bytes(bytes)
                }
            })
            .collect();
        Ok(Node::Kernel {
            name,
            grid: (p.gridDimX, p.gridDimY, p.gridDimZ),
            block: (p.blockDimX, p.blockDimY, p.blockDimZ),
            shared: p.sharedMemBytes,
            args,
        })
    }

    /// The graph's edges between nodes from `skip` on, as (from, to, edge type), sorted.
    ///
    /// # Safety
    /// `graph` is live and `handles` are its nodes, in the order `read` numbers them.
    unsafe fn edges(
        graph: sys::CUgraph,
        handles: &[sys::CUgraphNode],
        skip: usize,
    ) -> Result<Vec<(usize, usize, u8)>, GraphError> {
        let index: HashMap<usize, usize> = handles
            .iter()
            .enumerate()
            .map(|(i, &h)| (h as usize, i))
            .collect();
        // SAFETY: forwarded from the caller.
        let mut edges: Vec<(usize, usize, u8)> = unsafe { driver::graph_edges(graph) }?
            .into_iter()
            .filter_map(|(f, t, d)| {
                let (f, t) = (*index.get(&(f as usize))?, *index.get(&(t as usize))?);
                (f >= skip && t >= skip).then(|| (f - skip, t - skip, d.type_))
            })
            .collect();
        edges.sort_unstable();
        Ok(edges)
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
                    Arg::Words(words) => words
                        .iter()
                        .map(|w| match w {
                            Word::Temp(t, off) => format!("temporary {t} + {off}"),
                            Word::Handle(h) => format!("condition {h}"),
                            Word::Host => "a host address".to_owned(),
                            Word::Raw(v) => format!("{v:#x}"),
                        })
                        .collect::<Vec<_>>()
                        .join(", "),
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
        (Node::Conditional { bodies, .. }, Node::Conditional { bodies: b2, .. })
            if bodies.len() == b2.len() =>
        {
            let inner =
                bodies.iter().zip(b2).enumerate().find_map(|(i, (x, y))| {
                    x.first_difference(y).map(|d| format!("body {i}: {d}"))
                });
            match inner {
                Some(d) => format!("a conditional node whose {d}"),
                None => "a conditional node of another kind".to_owned(),
            }
        }
        (Node::Conditional { bodies, .. }, _) => {
            format!("a conditional node with {} bodies", bodies.len())
        }
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
            args: vec![
                Arg::Bytes(vec![arg; 4]),
                Arg::Words(vec![Word::Temp(0, 16)]),
            ],
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

        // A difference inside a conditional body is named with the body.
        let looped = |arg| Fingerprint {
            nodes: vec![Node::Conditional {
                kind: 1,
                bodies: vec![Fingerprint {
                    nodes: vec![kernel("step", arg)],
                    edges: vec![],
                }],
            }],
            edges: vec![],
        };
        assert_eq!(looped(1).first_difference(&looped(1)), None);
        let d = looped(1).first_difference(&looped(2)).unwrap();
        assert!(
            d.contains("conditional node whose body 0: node 0") && d.contains("`step`"),
            "{d}"
        );
    }
}
