//! Unit tests of the address book, the snapshot and the held forms of state.

use super::*;

/// A value whose regions the test controls, standing in for a struct of buffers.
struct Fake(Vec<(u64, usize)>);

// SAFETY: a test double; its regions are never written to.
unsafe impl DeviceState for Fake {
    type Lent<'a> = &'a mut Fake;
    fn regions(&self, visit: &mut dyn FnMut(DeviceRegion)) {
        for &(p, b) in &self.0 {
            visit(DeviceRegion::device(p, b));
        }
    }
    fn lend(&mut self) -> &mut Fake {
        self
    }
}

#[test]
fn unchanged_state_passes_and_moved_state_names_the_parameter() {
    let mut book = AddressBook::new("g");
    let a = Fake(vec![(0x1000, 64), (0x2000, 32)]);
    let i = book.record("kv", &a, Recorded::StateMut { restore: true });
    assert_eq!(book.record("w", &7u32, Recorded::State), 1);
    assert!(book.check(i, &a, When::Replay).is_ok());
    assert!(book.check(1, &7u32, When::Replay).is_ok());

    let moved = Fake(vec![(0x1000, 64), (0x3000, 32)]);
    let err = book.check(i, &moved, When::Replay).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(
            err,
            GraphError::StateMoved {
                graph: "g",
                param: "kv",
                when: When::Replay,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        msg.contains("buffer 2 of 2") && msg.contains("0x3000"),
        "{msg}"
    );

    let shorter = Fake(vec![(0x1000, 64)]);
    let err = book
        .check(i, &shorter, When::Warmup { run: 2 })
        .unwrap_err();
    assert!(err.to_string().contains("now holds 1"), "{err}");
    assert!(err.to_string().contains("warmup run 2"), "{err}");

    let longer = Fake(vec![(0x1000, 64), (0x2000, 32), (0x4000, 8)]);
    assert!(book.check(i, &longer, When::Capture).is_err());
}

#[test]
fn only_restorable_device_regions_are_snapshotted() {
    let mut book = AddressBook::new("g");
    book.record(
        "a",
        &Fake(vec![(0x10, 4), (0x20, 0)]),
        Recorded::StateMut { restore: true },
    );
    book.record(
        "b",
        &Fake(vec![(0x30, 8)]),
        Recorded::StateMut { restore: false },
    );
    book.record("c", &Fake(vec![(0x40, 8)]), Recorded::Output);
    let r: Vec<_> = book.restorable().collect();
    assert_eq!(r, vec![DeviceRegion::device(0x10, 4)]);
    let m: Vec<_> = book.mutable().map(|r| r.ptr).collect();
    assert_eq!(m, vec![0x10, 0x30]);
    let names: Vec<_> = book.mutable_entries().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, vec!["a", "b"]);
}

#[test]
fn containers_visit_every_buffer_in_order() {
    let v = vec![Fake(vec![(1, 1)]), Fake(vec![(2, 2), (3, 3)])];
    let mut seen = Vec::new();
    (v, Some(Fake(vec![(4, 4)])), 5u8).regions(&mut |r| seen.push(r.ptr));
    assert_eq!(seen, vec![1, 2, 3, 4]);
}

#[test]
#[allow(clippy::needless_borrows_for_generic_args)] // borrowing is what is tested
fn state_arguments_pick_how_the_graph_holds_them() {
    fn held<'s, A: StateArg<'s, u32>>(a: A) -> Held<'s, u32> {
        a.into_held()
    }
    fn held_mut<'s, A: StateArgMut<'s, u32>>(a: A) -> HeldMut<'s, u32> {
        a.into_held_mut()
    }
    let x = 3u32;
    assert!(matches!(held(&x), Held::Borrowed(_)));
    assert!(matches!(held(Arc::new(4)), Held::Shared(_)));
    assert!(matches!(held(5), Held::Owned(_)));
    let mut y = 6u32;
    {
        let mut h = held_mut(&mut y);
        *h += 1;
    }
    assert_eq!(y, 7);
    assert_eq!(*held_mut(8), 8);
}
