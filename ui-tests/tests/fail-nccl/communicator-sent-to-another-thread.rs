// A communicator stays on the thread that joined with it (its runtime's stream is the only
// one its collectives and graphs run on): moving it to another thread, or sharing it with
// one, does not compile.
use graph_runtime::nccl::Communicator;

fn moved(comm: Communicator) {
    std::thread::spawn(move || comm.barrier());
}

fn shared(comm: &Communicator) {
    std::thread::scope(|s| {
        s.spawn(|| comm.barrier());
    });
}

fn main() {}
