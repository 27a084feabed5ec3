// STUB until the helper's module lands.
use crate::shard::Unit;
use std::time::Duration;
#[derive(Debug)]
pub struct QueueError(String);
impl std::fmt::Display for QueueError {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
pub struct Queue;
pub enum Published {
    New,
    Existing,
}
pub struct Leased {
    pub id: i64,
    pub unit: Unit,
    pub attempts: u32,
}
pub struct Counts {
    pub todo: u64,
    pub leased: u64,
    pub done: u64,
    pub failed: u64,
}
impl Queue {
    pub fn connect(_url: &str, _run: &str) -> Result<Queue, QueueError> {
        Err(QueueError("stub".into()))
    }
    pub fn publish(&mut self, _h: &str, _m: &[u8], _u: &[Unit]) -> Result<Published, QueueError> {
        todo!()
    }
    pub fn manifest(&mut self) -> Result<Option<(String, Vec<u8>)>, QueueError> {
        todo!()
    }
    pub fn wait_published(&mut self, _t: Duration) -> Result<(String, Vec<u8>), QueueError> {
        todo!()
    }
    pub fn lease(&mut self, _w: &str, _n: u32, _l: Duration) -> Result<Vec<Leased>, QueueError> {
        todo!()
    }
    pub fn renew(&mut self, _w: &str, _ids: &[i64], _l: Duration) -> Result<usize, QueueError> {
        todo!()
    }
    pub fn done(&mut self, _w: &str, _ids: &[i64]) -> Result<(), QueueError> {
        todo!()
    }
    pub fn failed(&mut self, _w: &str, _id: i64, _e: &str, _m: u32) -> Result<(), QueueError> {
        todo!()
    }
    pub fn counts(&mut self) -> Result<Counts, QueueError> {
        todo!()
    }
    pub fn report_rank(
        &mut self,
        _r: u32,
        _w: &str,
        _v: &serde_json::Value,
    ) -> Result<(), QueueError> {
        todo!()
    }
    pub fn rank_reports(&mut self) -> Result<Vec<(u32, String, serde_json::Value)>, QueueError> {
        todo!()
    }
    pub fn claim_finalize(&mut self, _w: &str) -> Result<bool, QueueError> {
        todo!()
    }
    pub fn set_aggregate(&mut self, _v: &serde_json::Value) -> Result<(), QueueError> {
        todo!()
    }
}
