"""BlockMask: a mask_mod with its buffers and parameters for fixed sizes, whose device tile
lists are built once per kernel and reused by every launch that passes it."""
import itertools
import weakref

from ._flexjit import BlockMasks, check_mods

_handles = itertools.count(1)
# BlockMask objects by handle, for torch custom ops (whose arguments cannot be Python objects). Handles
# are strings: torch.compile keeps strings constant, where it could make an int a symbolic input.
_by_handle = weakref.WeakValueDictionary()


class BlockMask:
    """Made by ``create_block_mask``. ``mask_mod`` is the program text, ``shape`` the
    (B, H, Q_LEN, KV_LEN) it was made for; ``buffers`` and ``params`` are passed to every
    launch that uses it."""

    def __init__(self, mask_mod, B, H, Q_LEN, KV_LEN, buffers=None, params=None, source=None):
        if not isinstance(mask_mod, str):
            raise TypeError(f"mask_mod must be a str (a program in flexjit's language), got {type(mask_mod).__name__}")
        B = 1 if B is None else int(B)
        H = 1 if H is None else int(H)
        Q_LEN, KV_LEN = int(Q_LEN), int(KV_LEN)
        if min(B, H, Q_LEN, KV_LEN) < 1:
            raise ValueError(f"create_block_mask: B, H, Q_LEN and KV_LEN must be >= 1, got {B}, {H}, {Q_LEN}, {KV_LEN}")
        self.mask_mod = mask_mod
        self.shape = (B, H, Q_LEN, KV_LEN)
        self.buffers = dict(buffers or {})
        self.params = dict(params or {})
        # What the mask was made from when that was not text (flexjit.torch keeps the callable).
        self.source = source
        check_mods(None, mask_mod, self.buffers or None, self.params or None, B, H, Q_LEN, KV_LEN)
        self._masks = BlockMasks()
        self.handle = f"block_mask_{next(_handles)}"
        _by_handle[self.handle] = self

    def check_launch(self, B, H, Sq, Skv):
        """Raises ValueError unless a launch of these sizes may use this mask."""
        mb, mh, mq, mkv = self.shape
        if (mq, mkv) != (Sq, Skv):
            raise ValueError(f"the block mask was made for Q_LEN={mq}, KV_LEN={mkv} but the launch has Sq={Sq}, Skv={Skv}; "
                             "make one for these lengths")
        if mb not in (1, B) or mh not in (1, H):
            raise ValueError(f"the block mask was made for B={mb}, H={mh} but the launch has B={B}, H={H}; "
                             "make it with these sizes, or 1 (None) for a mask that is the same for all")

    def __repr__(self):
        return f"BlockMask(mask_mod={self.mask_mod!r}, shape={self.shape})"


def device_masks(block_mask):
    """The device masks a launch passing `block_mask` reuses (None without one)."""
    return block_mask._masks if block_mask is not None else None


def device_masks_by_handle(handle):
    """The device masks of the live BlockMask with this handle, for custom ops; None for "" or a
    mask no longer alive (the op's mask_mod, buffers and parameters are
    its own arguments, so the launch then builds the tile lists itself)."""
    mask = _by_handle.get(handle) if handle else None
    return mask._masks if mask is not None else None


def block_mask_by_handle(handle):
    """The live BlockMask with this handle, or None."""
    return _by_handle.get(handle) if handle else None


def _merged(what, mine, theirs):
    if not theirs:
        return mine or None
    merged = dict(theirs)
    for name, value in (mine or {}).items():
        if name in merged and merged[name] is not value:
            raise ValueError(f"{what} `{name}` is given both to the launch and to its block mask; give it once")
        merged[name] = value
    return merged


def merge_block_mask(block_mask, mask_mod, buffers, params, B, H, Sq, Skv):
    """The mask_mod, buffers and parameters of a launch that passes `block_mask` (checked
    against the launch's sizes; None: the launch's own)."""
    if block_mask is None:
        return mask_mod, buffers, params
    if not isinstance(block_mask, BlockMask):
        raise TypeError(f"block_mask must come from flexjit.create_block_mask, got {type(block_mask).__name__}")
    if mask_mod is not None:
        raise ValueError("give the mask either as mask_mod or as block_mask, not both")
    block_mask.check_launch(B, H, Sq, Skv)
    return block_mask.mask_mod, _merged("buffer", buffers, block_mask.buffers), _merged("parameter", params, block_mask.params)
