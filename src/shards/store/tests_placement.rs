//! Store tests of placement: where a put lands (the default medium, `prefer_rank`).

use super::testing::TestStore;
use super::*;

/// A put with no medium asked for and a preferred rank without HBM lands in that rank's DRAM,
/// not in another rank's HBM (the default medium of the whole store): the preference holds.
#[test]
fn a_preferred_rank_without_hbm_takes_the_put_in_its_dram() {
    let mut s = TestStore::new()
        .segment(0, Medium::Hbm, 4 << 20)
        .remote_segment(1, Medium::Dram, 4 << 20)
        .build();
    let placement = Placement {
        prefer_rank: Some(1),
        ..Placement::on(None, 1)
    };
    let step = s.alloc(b"p".as_slice().into(), 4096, placement);
    let AllocStep::Granted { obj, blobs, .. } = step else {
        panic!("alloc refused: {step:?}");
    };
    assert_eq!((blobs[0].seg.rank, blobs[0].seg.medium), (1, Medium::Dram));
    assert!(s.commit(obj, true));
    // Without a preference the default medium stays HBM.
    let step = s.alloc(b"q".as_slice().into(), 4096, Placement::on(None, 1));
    let AllocStep::Granted { blobs, .. } = step else {
        panic!("alloc refused: {step:?}");
    };
    assert_eq!((blobs[0].seg.rank, blobs[0].seg.medium), (0, Medium::Hbm));
    s.check();
}
