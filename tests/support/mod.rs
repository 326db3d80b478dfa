//! The one test harness every suite shares. Each test binary uses part of it.
#![allow(dead_code)]

pub mod engine;
pub mod faulty;
