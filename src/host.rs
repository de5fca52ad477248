//! What this machine has to give right now: memory a new allocation can get, and whether other
//! processes compete for its cores. Low in the module order (no crate imports), so loading a
//! model can ask before it reads weights.

/// Memory the kernel says a new allocation can get without swapping (`MemAvailable`), where
/// the platform tells it.
pub fn available_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

/// Other processes' threads ready to run, at the moment of asking: the fewest, over a few quick
/// readings, of `procs_running` in /proc/stat less this process's own running threads (an
/// engine's pool may still be spinning). Timing then competes with them for the cores. `None`
/// where the platform does not tell.
pub fn other_runnable_processes() -> Option<usize> {
    let all = || -> Option<usize> {
        let text = std::fs::read_to_string("/proc/stat").ok()?;
        let line = text.lines().find(|l| l.starts_with("procs_running"))?;
        line.split_whitespace().nth(1)?.parse().ok()
    };
    let own = || -> Option<usize> {
        let mut n = 0;
        for t in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
            let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
            // The state follows the parenthesised name, which may itself hold spaces.
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next());
            n += (state == Some('R')) as usize;
        }
        Some(n)
    };
    let mut fewest = usize::MAX;
    for _ in 0..5 {
        let total = all()?;
        fewest = fewest.min(total.saturating_sub(own()?.max(1)));
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    Some(fewest)
}

/// Cores this process may run on.
pub fn cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}
