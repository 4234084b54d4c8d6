//! [`Checkpoint`]s as bytes, for ranks in other processes: fields separated by the ASCII unit
//! separator, one checkpoint per value of the store ([`super::store`]).
//!
//! Names (graphs, element types, source files) come back as `&'static str` through a table
//! of interned strings: a process sees few distinct ones (its graphs' names, its types, its
//! files), so the table stays small.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

use super::sequence::{CallSite, Checkpoint, CollectiveCall, CollectiveOp, ReduceOp};

const SEP: char = '\u{1f}';

/// `s` as a `&'static str`, one allocation per distinct string for the process's life.
fn intern(s: &str) -> &'static str {
    static TABLE: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let mut table = TABLE
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(&known) = table.get(s) {
        return known;
    }
    let leaked: &'static str = Box::leak(s.to_owned().into_boxed_str());
    table.insert(leaked);
    leaked
}

fn op_text(op: CollectiveOp) -> String {
    match op {
        CollectiveOp::AllReduce(r) => format!("ar:{}", r.name()),
        CollectiveOp::AllGather => "ag".to_owned(),
        CollectiveOp::ReduceScatter(r) => format!("rs:{}", r.name()),
        CollectiveOp::Broadcast { root } => format!("bc:{root}"),
    }
}

fn parse_op(s: &str) -> Option<CollectiveOp> {
    Some(match s.split_once(':') {
        None if s == "ag" => CollectiveOp::AllGather,
        Some(("ar", r)) => CollectiveOp::AllReduce(ReduceOp::from_name(r)?),
        Some(("rs", r)) => CollectiveOp::ReduceScatter(ReduceOp::from_name(r)?),
        Some(("bc", root)) => CollectiveOp::Broadcast {
            root: root.parse().ok()?,
        },
        _ => return None,
    })
}

fn push_call(out: &mut Vec<String>, c: &CollectiveCall) {
    out.push(op_text(c.op));
    out.push(c.dtype.to_owned());
    out.push(c.count.to_string());
    out.push(c.group.to_string());
    out.push(c.location.file.to_owned());
    out.push(c.location.line.to_string());
    out.push(c.location.column.to_string());
}

fn take_call<'a>(f: &mut impl Iterator<Item = &'a str>) -> Option<CollectiveCall> {
    Some(CollectiveCall {
        op: parse_op(f.next()?)?,
        dtype: intern(f.next()?),
        count: f.next()?.parse().ok()?,
        group: f.next()?.parse().ok()?,
        location: CallSite {
            file: intern(f.next()?),
            line: f.next()?.parse().ok()?,
            column: f.next()?.parse().ok()?,
        },
    })
}

/// `c` as bytes.
pub(crate) fn encode(c: &Checkpoint) -> Vec<u8> {
    let mut f: Vec<String> = Vec::new();
    match c {
        Checkpoint::Joined { ordinal } => {
            f.push("J".into());
            f.push(ordinal.to_string());
        }
        Checkpoint::Warmup {
            graph,
            run,
            index,
            call,
        } => {
            f.extend([
                "W".into(),
                graph.to_string(),
                run.to_string(),
                index.to_string(),
            ]);
            push_call(&mut f, call);
        }
        Checkpoint::Captured { graph, calls } => {
            f.extend(["C".into(), graph.to_string(), calls.len().to_string()]);
            for call in calls {
                push_call(&mut f, call);
            }
        }
        Checkpoint::Done => f.push("D".into()),
        Checkpoint::Barrier => f.push("B".into()),
        Checkpoint::Window { bytes, allocated } => {
            f.extend([
                "w".into(),
                bytes.to_string(),
                u8::from(*allocated).to_string(),
            ]);
        }
        Checkpoint::PeerMemory {
            ready,
            ctx,
            base,
            ordinal,
        } => f.extend([
            "P".into(),
            u8::from(*ready).to_string(),
            ctx.to_string(),
            base.to_string(),
            ordinal.to_string(),
        ]),
    }
    f.join(&SEP.to_string()).into_bytes()
}

/// The checkpoint `bytes` encode, or `None` when they are not one (another version of the
/// library on another rank, say).
pub(crate) fn decode(bytes: &[u8]) -> Option<Checkpoint> {
    let text = std::str::from_utf8(bytes).ok()?;
    let mut f = text.split(SEP);
    let c = match f.next()? {
        "J" => Checkpoint::Joined {
            ordinal: f.next()?.parse().ok()?,
        },
        "W" => Checkpoint::Warmup {
            graph: intern(f.next()?),
            run: f.next()?.parse().ok()?,
            index: f.next()?.parse().ok()?,
            call: take_call(&mut f)?,
        },
        "C" => {
            let graph = intern(f.next()?);
            let n: usize = f.next()?.parse().ok()?;
            let calls = (0..n)
                .map(|_| take_call(&mut f))
                .collect::<Option<Vec<_>>>()?;
            Checkpoint::Captured { graph, calls }
        }
        "D" => Checkpoint::Done,
        "B" => Checkpoint::Barrier,
        "w" => Checkpoint::Window {
            bytes: f.next()?.parse().ok()?,
            allocated: f.next()? == "1",
        },
        "P" => Checkpoint::PeerMemory {
            ready: f.next()? == "1",
            ctx: f.next()?.parse().ok()?,
            base: f.next()?.parse().ok()?,
            ordinal: f.next()?.parse().ok()?,
        },
        _ => return None,
    };
    f.next().is_none().then_some(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(op: CollectiveOp, count: usize) -> CollectiveCall {
        CollectiveCall {
            op,
            dtype: "f32",
            count,
            group: 0xdead_beef_1234,
            location: std::panic::Location::caller().into(),
        }
    }

    #[test]
    fn every_checkpoint_survives_the_trip() {
        let all = [
            Checkpoint::Joined { ordinal: 3 },
            Checkpoint::Warmup {
                graph: "tp_step",
                run: 2,
                index: 7,
                call: call(CollectiveOp::ReduceScatter(ReduceOp::Max), 4096),
            },
            Checkpoint::Captured {
                graph: "tp_step",
                calls: vec![
                    call(CollectiveOp::AllReduce(ReduceOp::Sum), 1),
                    call(CollectiveOp::AllGather, 2),
                    call(CollectiveOp::Broadcast { root: 1 }, 3),
                    call(CollectiveOp::AllReduce(ReduceOp::Avg), 4),
                ],
            },
            Checkpoint::Captured {
                graph: "empty",
                calls: vec![],
            },
            Checkpoint::Done,
            Checkpoint::Barrier,
            Checkpoint::Window {
                bytes: 1 << 20,
                allocated: false,
            },
            Checkpoint::PeerMemory {
                ready: true,
                ctx: 0x7f00_0000_0000,
                base: 0x7f12_3456_0000,
                ordinal: 1,
            },
        ];
        for c in all {
            let back = decode(&encode(&c)).unwrap_or_else(|| panic!("{c:?} did not decode"));
            assert_eq!(format!("{back:?}"), format!("{c:?}"));
        }
    }

    #[test]
    fn garbage_is_not_a_checkpoint() {
        assert!(decode(b"").is_none());
        assert!(decode(b"Q").is_none());
        assert!(decode("J\u{1f}x".as_bytes()).is_none());
        assert!(decode("B\u{1f}extra".as_bytes()).is_none());
        assert!(decode("C\u{1f}g\u{1f}2\u{1f}ar:sum".as_bytes()).is_none());
        assert!(decode(&[0xff, 0xfe]).is_none());
    }

    #[test]
    fn names_are_interned_once() {
        assert!(std::ptr::eq(
            intern("graph_a"),
            intern(&String::from("graph_a"))
        ));
    }
}
