//! Rules for what a captured body may not do, checked on the tokens of the body.
//!
//! (The full rule table arrives with the compile-time checks; this module is where it lives.)

use syn::ItemFn;

use crate::args::GraphArgs;
use crate::ctxt::Ctxt;

/// Checks the body of `item`, recording one error per offending expression.
pub fn check_body(_item: &ItemFn, _args: &GraphArgs, _cx: &mut Ctxt) {}
