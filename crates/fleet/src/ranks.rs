//! Which rank this process is, and how many there are, as the launcher says.
