//! Which rank this process is, and how many there are, as the launcher says.
// STUB until the helper's module lands.
#[derive(Debug, Clone)]
pub enum Launcher {
    Slurm,
    OpenMpi,
    Pmi,
    Kubernetes,
    Flags,
}
impl std::fmt::Display for Launcher {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}
#[derive(Debug, Clone)]
pub struct Rank {
    pub rank: u32,
    pub size: u32,
    pub launcher: Launcher,
}
pub fn from_env(get: impl Fn(&str) -> Option<String>, size: Option<u32>) -> Result<Rank, String> {
    let n = |k: &str| get(k).and_then(|v| v.parse::<u32>().ok());
    if let (Some(r), Some(s)) = (n("SLURM_PROCID"), n("SLURM_NTASKS")) {
        return Ok(Rank {
            rank: r,
            size: s,
            launcher: Launcher::Slurm,
        });
    }
    if let (Some(r), Some(s)) = (n("OMPI_COMM_WORLD_RANK"), n("OMPI_COMM_WORLD_SIZE")) {
        return Ok(Rank {
            rank: r,
            size: s,
            launcher: Launcher::OpenMpi,
        });
    }
    if let (Some(r), Some(s)) = (n("JOB_COMPLETION_INDEX"), size) {
        return Ok(Rank {
            rank: r,
            size: s,
            launcher: Launcher::Kubernetes,
        });
    }
    Err("no launcher".into())
}
pub fn from_flags(rank: u32, size: u32) -> Result<Rank, String> {
    Ok(Rank {
        rank,
        size,
        launcher: Launcher::Flags,
    })
}
