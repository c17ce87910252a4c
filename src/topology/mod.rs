//! The topology file: model, parsing with positions, validation, and the
//! plan of broker objects it generates.

mod model;

pub use model::*;
