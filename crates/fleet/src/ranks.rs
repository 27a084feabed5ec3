//! Which rank this process is, and how many there are, as the launcher
//! says. No MPI library is linked: launchers only start processes, and
//! each says the rank in variables of its own. They are read in a fixed
//! order, and the one used is named (a job step under Slurm that runs
//! `mpirun` sees both; Slurm's are the job's own).

use std::fmt;

/// Where a rank came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// `srun`: SLURM_PROCID / SLURM_NTASKS.
    Slurm,
    /// Open MPI's `mpirun`: OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE.
    OpenMpi,
    /// MPICH, Intel MPI and other PMI launchers: PMI_RANK / PMI_SIZE.
    Pmi,
    /// A Kubernetes indexed Job: JOB_COMPLETION_INDEX, the size given.
    Kubernetes,
    /// `--rank R --ranks N`.
    Flags,
}

impl fmt::Display for Launcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Launcher::Slurm => "Slurm (SLURM_PROCID/SLURM_NTASKS)",
            Launcher::OpenMpi => "Open MPI (OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE)",
            Launcher::Pmi => "PMI (PMI_RANK/PMI_SIZE)",
            Launcher::Kubernetes => "a Kubernetes indexed Job (JOB_COMPLETION_INDEX, --ranks N)",
            Launcher::Flags => "--rank/--ranks",
        })
    }
}

/// This process's place in the fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rank {
    pub rank: u32,
    pub size: u32,
    pub launcher: Launcher,
}

/// The launchers' variables, in the order they are checked: rank, size.
const PAIRS: [(Launcher, &str, &str); 3] = [
    (Launcher::Slurm, "SLURM_PROCID", "SLURM_NTASKS"),
    (
        Launcher::OpenMpi,
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
    ),
    (Launcher::Pmi, "PMI_RANK", "PMI_SIZE"),
];

fn number(get: &impl Fn(&str) -> Option<String>, var: &str) -> Result<Option<u32>, String> {
    match get(var) {
        None => Ok(None),
        Some(v) => v.trim().parse::<u32>().map(Some).map_err(|_| {
            format!("{var}={v:?} is not a rank number: is the launcher's environment intact?")
        }),
    }
}

/// The rank the launcher gave this process: the first launcher whose rank
/// variable is set wins; `size` is the size of a Kubernetes indexed Job
/// (its `.spec.completions`), which no variable gives.
pub fn from_env(get: impl Fn(&str) -> Option<String>, size: Option<u32>) -> Result<Rank, String> {
    for (launcher, rank_var, size_var) in PAIRS {
        let Some(rank) = number(&get, rank_var)? else {
            continue;
        };
        let Some(n) = number(&get, size_var)? else {
            return Err(format!(
                "{rank_var} is set but {size_var} is not: run under the launcher that sets both, or give --rank R --ranks N"
            ));
        };
        if let Some(s) = size.filter(|s| *s != n) {
            return Err(format!(
                "--ranks {s} disagrees with {size_var}={n}: say --ranks auto under {launcher}"
            ));
        }
        return checked(rank, n, launcher);
    }
    if let Some(index) = number(&get, "JOB_COMPLETION_INDEX")? {
        let Some(n) = size else {
            return Err(
                "JOB_COMPLETION_INDEX is set (a Kubernetes indexed Job) but the Job's size is not: pass --ranks N, the Job's .spec.completions".into(),
            );
        };
        return checked(index, n, Launcher::Kubernetes);
    }
    Err("--ranks auto: no launcher said this process's rank (none of SLURM_PROCID/SLURM_NTASKS, OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE, PMI_RANK/PMI_SIZE, JOB_COMPLETION_INDEX is set): run it under srun, mpirun or an indexed Job, or give --rank R --ranks N".into())
}

/// The launcher's name for this start of the fleet, when it gives one:
/// a Slurm job step (`SLURM_JOB_ID.SLURM_STEP_ID`), an Open MPI job
/// (`OMPI_MCA_ess_base_jobid`), a PMIx namespace. A rank's result from
/// another start is stale: the whole fleet is running again.
pub fn job_from_env(get: impl Fn(&str) -> Option<String>) -> Option<String> {
    if let Some(job) = get("SLURM_JOB_ID") {
        let step = get("SLURM_STEP_ID").unwrap_or_default();
        return Some(format!("slurm:{job}.{step}"));
    }
    get("OMPI_MCA_ess_base_jobid")
        .map(|j| format!("ompi:{j}"))
        .or_else(|| get("PMIX_NAMESPACE").map(|n| format!("pmix:{n}")))
}

/// `--rank R --ranks N`.
pub fn from_flags(rank: u32, size: u32) -> Result<Rank, String> {
    checked(rank, size, Launcher::Flags)
}

fn checked(rank: u32, size: u32, launcher: Launcher) -> Result<Rank, String> {
    if size == 0 {
        return Err(format!(
            "{launcher} says the fleet has no ranks: give a size of 1 or more"
        ));
    }
    if rank >= size {
        return Err(format!(
            "rank {rank} is not below the size {size} (from {launcher}): ranks count from 0"
        ));
    }
    Ok(Rank {
        rank,
        size,
        launcher,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn each_launcher_is_read_and_named() {
        let r = from_env(env(&[("SLURM_PROCID", "3"), ("SLURM_NTASKS", "8")]), None).unwrap();
        assert_eq!((r.rank, r.size, r.launcher), (3, 8, Launcher::Slurm));
        let r = from_env(
            env(&[("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "4")]),
            None,
        )
        .unwrap();
        assert_eq!((r.rank, r.size, r.launcher), (1, 4, Launcher::OpenMpi));
        let r = from_env(env(&[("PMI_RANK", "0"), ("PMI_SIZE", "2")]), None).unwrap();
        assert_eq!(r.launcher, Launcher::Pmi);
        let r = from_env(env(&[("JOB_COMPLETION_INDEX", "5")]), Some(6)).unwrap();
        assert_eq!((r.rank, r.size, r.launcher), (5, 6, Launcher::Kubernetes));
        assert!(r.launcher.to_string().contains("JOB_COMPLETION_INDEX"));
    }

    #[test]
    fn slurm_comes_first_when_mpirun_runs_inside_a_job_step() {
        let r = from_env(
            env(&[
                ("OMPI_COMM_WORLD_RANK", "2"),
                ("OMPI_COMM_WORLD_SIZE", "4"),
                ("SLURM_PROCID", "0"),
                ("SLURM_NTASKS", "1"),
            ]),
            None,
        )
        .unwrap();
        assert_eq!(r.launcher, Launcher::Slurm);
    }

    #[test]
    fn a_start_of_the_fleet_is_named_by_its_launcher() {
        assert_eq!(
            job_from_env(env(&[("SLURM_JOB_ID", "77"), ("SLURM_STEP_ID", "2")])).as_deref(),
            Some("slurm:77.2")
        );
        assert_eq!(
            job_from_env(env(&[("OMPI_MCA_ess_base_jobid", "9")])).as_deref(),
            Some("ompi:9")
        );
        assert_eq!(job_from_env(env(&[])), None);
    }

    #[test]
    fn what_is_missing_or_wrong_is_named() {
        let e = from_env(env(&[]), None).unwrap_err();
        for v in [
            "SLURM_PROCID",
            "OMPI_COMM_WORLD_RANK",
            "PMI_RANK",
            "JOB_COMPLETION_INDEX",
            "--rank",
        ] {
            assert!(e.contains(v), "{e}");
        }
        let e = from_env(env(&[("JOB_COMPLETION_INDEX", "1")]), None).unwrap_err();
        assert!(e.contains("--ranks N"), "{e}");
        let e = from_env(env(&[("SLURM_PROCID", "x"), ("SLURM_NTASKS", "2")]), None).unwrap_err();
        assert!(e.contains("SLURM_PROCID=\"x\""), "{e}");
        let e = from_env(env(&[("SLURM_PROCID", "1")]), None).unwrap_err();
        assert!(e.contains("SLURM_NTASKS"), "{e}");
        let e = from_env(env(&[("PMI_RANK", "4"), ("PMI_SIZE", "4")]), None).unwrap_err();
        assert!(e.contains("rank 4 is not below the size 4"), "{e}");
        let e = from_env(env(&[("PMI_RANK", "1"), ("PMI_SIZE", "4")]), Some(3)).unwrap_err();
        assert!(e.contains("disagrees"), "{e}");
        assert!(from_flags(0, 0).is_err());
        assert!(from_flags(2, 2).is_err());
        assert_eq!(from_flags(1, 2).unwrap().launcher, Launcher::Flags);
    }
}
