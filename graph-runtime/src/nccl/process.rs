//! Ranks started as separate processes: the launcher's environment ([`Launch`]), the store
//! rank 0 serves, and [`CommGroup::connect`], which makes a group whose ranks meet through
//! it (see [`crate::nccl`]'s "Ranks in several processes").

use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use cudarc::nccl::sys;

use super::comm::{CommGroup, Communicator};
use super::rendezvous::Rendezvous;
use super::store::{StoreClient, StoreServer};
use crate::error::{CollectiveError, GraphError};
use crate::runtime::Runtime;

/// Where this process sits among the ranks of a job, as its launcher says: `torchrun`'s
/// `RANK`, `WORLD_SIZE`, `LOCAL_RANK`; Open MPI's `OMPI_COMM_WORLD_RANK`, `…_SIZE`,
/// `…_LOCAL_RANK`; Slurm's `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID` (the first found
/// of each, in that order); and always `MASTER_ADDR` and `MASTER_PORT`, where rank 0 serves
/// the store the ranks meet on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// This process's rank, `0..world`.
    pub rank: usize,
    /// How many ranks (processes) the job has.
    pub world: usize,
    /// This process's rank on its host: the GPU it uses.
    pub local_rank: usize,
    /// Rank 0's store.
    pub store: SocketAddr,
}

const RANK: [&str; 3] = ["RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"];
const WORLD: [&str; 3] = ["WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"];
const LOCAL: [&str; 3] = ["LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"];

impl Launch {
    /// This process's place, from the environment.
    pub fn from_env() -> Result<Launch, GraphError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// This process's place, from `var` (the environment, or a map in a test).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Launch, GraphError> {
        let bad = |detail: String| -> GraphError { CollectiveError::Launch { detail }.into() };
        let number = |names: &[&'static str]| -> Result<Option<usize>, GraphError> {
            for name in names {
                if let Some(v) = var(name) {
                    return v
                        .trim()
                        .parse()
                        .map(Some)
                        .map_err(|_| bad(format!("{name}={v} is not a number")));
                }
            }
            Ok(None)
        };
        let missing = |names: &[&str]| bad(format!("none of {} is set", names.join(", ")));
        let rank = number(&RANK)?.ok_or_else(|| missing(&RANK))?;
        let world = number(&WORLD)?.ok_or_else(|| missing(&WORLD))?;
        if rank >= world {
            return Err(bad(format!(
                "rank {rank} is not below the world size {world}"
            )));
        }
        let local_rank = number(&LOCAL)?.ok_or_else(|| missing(&LOCAL))?;
        let addr = var("MASTER_ADDR").ok_or_else(|| missing(&["MASTER_ADDR"]))?;
        let port = number(&["MASTER_PORT"])?.ok_or_else(|| missing(&["MASTER_PORT"]))?;
        let port = u16::try_from(port)
            .map_err(|_| bad(format!("MASTER_PORT={port} is not a TCP port (0 to 65535)")))?;
        let store = (addr.as_str(), port)
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| bad(format!("MASTER_ADDR={addr} does not resolve")))?;
        Ok(Launch {
            rank,
            world,
            local_rank,
            store,
        })
    }
}

/// The stores this process serves, by port (rank 0 serves one per port for the process's
/// life; a second group on the same port shares it).
fn serve(port: u16) -> std::io::Result<()> {
    static SERVED: OnceLock<Mutex<HashMap<u16, StoreServer>>> = OnceLock::new();
    let mut served = SERVED
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let std::collections::hash_map::Entry::Vacant(slot) = served.entry(port) {
        let server = StoreServer::start(("0.0.0.0", port))?;
        tracing::debug!(addr = %server.addr(), "serving the ranks' store");
        slot.insert(server);
    }
    Ok(())
}

/// The groups this process has connected, in order: the n-th group of every process is the
/// same group, so its keys in the store are `group/n/…`.
static CONNECTED: AtomicU64 = AtomicU64::new(0);

/// The unique id's 128 bytes, as the store carries them.
fn uid_bytes(uid: &sys::ncclUniqueId) -> [u8; 128] {
    bytemuck::cast(uid.internal)
}

/// FNV-1a of the unique id: the group's number, the same in every process.
fn id_of(uid: &[u8]) -> u64 {
    uid.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl CommGroup {
    /// The group this process is rank `launch.rank` of, its other ranks being processes too
    /// (on this host or others): rank 0 serves a store on `launch.store`'s port, every rank
    /// connects to it, rank 0 makes NCCL's unique id and the others read it from there.
    /// The ranks then meet on the store for everything the threads of one process meet on
    /// a mutex for (joining, comparing captures, failures, timeouts), with the same errors.
    ///
    /// Connect the groups of a job in the same order in every process. The process joins
    /// its own rank only ([`CommGroup::join`] with `launch.rank`, or
    /// [`Communicator::from_env`]); the one-shot all-reduce is off (it needs the peers'
    /// memory mapped into this process).
    pub fn connect(launch: &Launch, timeout: Duration) -> Result<CommGroup, GraphError> {
        crate::phase::refuse_while_capturing(|graph| {
            CollectiveError::SetupInCapture {
                op: "CommGroup::connect",
                graph,
            }
            .into()
        })?;
        let unreachable = |e: std::io::Error| -> GraphError {
            CollectiveError::Launch {
                detail: format!("the store at {} could not be reached: {e}", launch.store),
            }
            .into()
        };
        if launch.rank == 0 {
            serve(launch.store.port()).map_err(|e| -> GraphError {
                CollectiveError::Launch {
                    detail: format!(
                        "rank 0 could not serve the store on port {}: {e}",
                        launch.store.port()
                    ),
                }
                .into()
            })?;
        }
        let version = super::library::load()?;
        let n = CONNECTED.fetch_add(1, Ordering::Relaxed);
        let client = StoreClient::connect(launch.store, timeout).map_err(unreachable)?;
        let key = format!("group/{n}/uid");
        let uid = if launch.rank == 0 {
            let uid = super::raw::unique_id().map_err(|e| {
                super::raw::error("ncclGetUniqueId", 0, e, Some(std::ptr::null_mut()))
            })?;
            client.set(&key, &uid_bytes(&uid)).map_err(unreachable)?;
            uid
        } else {
            let bytes = client
                .wait(&key, timeout)
                .map_err(unreachable)?
                .ok_or_else(|| {
                    GraphError::from(CollectiveError::Timeout {
                        rank: launch.rank,
                        at: "waiting for rank 0's NCCL unique id".to_owned(),
                        missing: vec![0],
                        waited: timeout,
                    })
                })?;
            let bytes: [u8; 128] = bytes.as_slice().try_into().map_err(|_| {
                GraphError::from(CollectiveError::Launch {
                    detail: format!("rank 0's unique id has {} bytes, not 128", bytes.len()),
                })
            })?;
            sys::ncclUniqueId {
                internal: bytemuck::cast(bytes),
            }
        };
        let id = id_of(&uid_bytes(&uid));
        let rendezvous = Rendezvous::over_store(launch.world, client, format!("group/{n}"));
        let group = CommGroup::assemble(
            id,
            launch.world,
            uid,
            version,
            Arc::new(rendezvous),
            Some(launch.rank),
        );
        group.set_timeout(timeout);
        Ok(group)
    }
}

impl Communicator {
    /// This process's communicator in the job its launcher started ([`Launch::from_env`]):
    /// connects the group ([`CommGroup::connect`], with [`super::DEFAULT_TIMEOUT`]), makes a
    /// [`Runtime`] on GPU `LOCAL_RANK` and joins. For `torchrun --nproc-per-node=N`,
    /// `mpirun -np N` (with `MASTER_ADDR` and `MASTER_PORT` exported) or `srun`.
    pub fn from_env() -> Result<Communicator, GraphError> {
        let launch = Launch::from_env()?;
        let group = CommGroup::connect(&launch, super::DEFAULT_TIMEOUT)?;
        let rt = Runtime::new(launch.local_rank)?;
        group.join(&rt, launch.rank)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn torchrun_mpirun_and_slurm_spellings_are_read() {
        let torchrun = vars(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29500"),
        ]);
        let l = Launch::from_vars(torchrun).unwrap();
        assert_eq!((l.rank, l.world, l.local_rank), (1, 4, 1));
        assert_eq!(l.store, "127.0.0.1:29500".parse().unwrap());
        let mpi = vars(&[
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "8"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "3"),
            ("MASTER_ADDR", "localhost"),
            ("MASTER_PORT", "1234"),
        ]);
        let l = Launch::from_vars(mpi).unwrap();
        assert_eq!(
            (l.rank, l.world, l.local_rank, l.store.port()),
            (3, 8, 3, 1234)
        );
        let slurm = vars(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "16"),
            ("SLURM_LOCALID", "1"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "1"),
        ]);
        assert_eq!(Launch::from_vars(slurm).unwrap().local_rank, 1);
    }

    #[test]
    fn a_broken_environment_says_what_is_wrong() {
        let text = |pairs: &[(&str, &str)]| Launch::from_vars(vars(pairs)).unwrap_err().to_string();
        assert!(text(&[]).contains("none of RANK, OMPI_COMM_WORLD_RANK, SLURM_PROCID is set"));
        assert!(text(&[("RANK", "x")]).contains("RANK=x is not a number"));
        let no_addr = text(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0")]);
        assert!(no_addr.contains("MASTER_ADDR"), "{no_addr}");
        let too_high = text(&[("RANK", "2"), ("WORLD_SIZE", "2")]);
        assert!(
            too_high.contains("rank 2 is not below the world size 2"),
            "{too_high}"
        );
        let port = text(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "0"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "70000"),
        ]);
        assert!(
            port.contains("MASTER_PORT=70000 is not a TCP port"),
            "{port}"
        );
    }

    #[test]
    fn the_group_number_is_the_same_for_the_same_id() {
        let a = id_of(&[1, 2, 3]);
        assert_eq!(a, id_of(&[1, 2, 3]));
        assert_ne!(a, id_of(&[1, 2, 4]));
    }
}
