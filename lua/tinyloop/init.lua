-- tinyloop - the Lua API over libtinyloop (see lua/README.md).
--
--   local tl = require "tinyloop"
--   local model = tl.Model("model.gguf", { max_seq_len = 2048 })
--   local pool = tl.PrefixPool(16)
--   model:register_prefix(pool, system_tokens)
--   local out = model:generate_with_pool(pool, prompt, { max_tokens = 128, temperature = 0 })
--   for tok in model:stream(prompt, { pool = pool }) do io.write(model:piece(tok)) end
--   model:close()
--
-- It mirrors the PrefixPool API (docs/prefix-pool.md; first written for Python) call for
-- call: same names, defaults and messages. Misuse raises error(msg, 2)
-- naming the argument and its value; a runtime failure (KV full, out of
-- memory, a busy queue) returns nil, message, code (C.TL_ERR_*), as
-- OpenResty's APIs do (lua/README.md).
local ffi = require "ffi"
local lib = require "tinyloop.lib"
local new_tab = require "table.new"
local textstream = require "tinyloop.textstream"

local C = lib.load()
local ffi_new, ffi_string, ffi_gc, ffi_copy = ffi.new, ffi.string, ffi.gc, ffi.copy
local ffi_cast, ffi_typeof, ffi_sizeof = ffi.cast, ffi.typeof, ffi.sizeof
local type, tonumber, tostring, error, setmetatable, getmetatable, rawget, next =
    type, tonumber, tostring, error, setmetatable, getmetatable, rawget, next
local floor, format = math.floor, string.format

local _M = { _VERSION = "0.1.0", status = lib.status, lib = lib }
local serial = 0 -- of models opened, for stream guards
local open_states = {} -- model state by serial, while the model is open

local INT_MAX = 2147483647
local S = lib.status

local int32_vla = ffi_typeof("int32_t[?]")
local char_vla = ffi_typeof("char[?]")
local int32_ptr = ffi_typeof("int32_t *")
local prefix_ptr = ffi_typeof("tl_prefix *")
local model_ptr = ffi_typeof("tl_model *")

-- Scratch cdata, allocated once. Nothing in this module yields between
-- filling one and reading it, so one set serves every model and coroutine.
local model_out = ffi_new("tl_model *[1]")
local prefix_out = ffi_new("tl_prefix *[1]")
local id_out = ffi_new("int64_t[1]")
local one_tok = ffi_new("int32_t[1]")
local finished = ffi_new("int[1]")
local info_buf = ffi_new("tl_model_info[1]")
local stats_buf = ffi_new("tl_cache_stats[1]")
local mparams = ffi_new("tl_model_params")
local gp = ffi_new("tl_generate_params")
local gp_sampling = gp.sampling -- a reference into gp, kept so filling it allocates nothing
local default_gp = C.tl_generate_default_params()
local GP_SIZE = ffi_sizeof("tl_generate_params")


local args = require "tinyloop.args"
local show, bad, raise_rc, fail_rc = args.show, args.bad, args.raise_rc, args.fail_rc
local SAMPLING = args.SAMPLING
local opt_table, opt_int, opt_num, opt_bool = args.opt_table, args.opt_int, args.opt_num, args.opt_bool
local check_keys, keyset = args.check_keys, args.keyset


-- int32_t cdata kinds by ctype id: 0 = not a token array, -1 = a pointer
-- (length must be given), n > 0 = a fixed array of n; VLAs report their
-- length through ffi.sizeof. Filled lazily, once per ctype.
local ctype_kind = {}

local function cdata_len(x)
    local id = tonumber(ffi_typeof(x))
    local kind = ctype_kind[id]
    if not kind then
        local name = tostring(ffi_typeof(x)):gsub("^ctype<const ", "ctype<")
        if name == "ctype<int *>" then
            kind = -1
        elseif name:match("^ctype<int %[[%d?]+%]>$") then
            kind = 1
        else
            kind = 0
        end
        ctype_kind[id] = kind
    end
    if kind == 1 then
        return ffi_sizeof(x) / 4
    end
    return kind
end


-- Token ids as (const int32_t *, n). Lua tables are copied into the model's
-- scratch buffer (grown when a table is longer than it); cdata is used in
-- place. n_given is the explicit length for cdata (required for pointers).
-- Every id is checked against the vocab here, so messages name the Lua
-- argument and index (1-based for tables, 0-based for cdata).
local function to_tokens(self, fname, arg, toks, n_given, level)
    local n_vocab = self.n_vocab
    local tt = type(toks)
    if tt == "table" then
        local n = #toks
        if n > self._in_cap then
            self._in_cap = n
            self._in = ffi_new(int32_vla, n)
        end
        local buf = self._in
        for i = 1, n do
            local v = toks[i]
            if type(v) ~= "number" or v ~= floor(v) then
                bad(fname, arg, format("token %s at index %d is not an integer", show(v), i), level + 1)
            end
            if v < 0 or v >= n_vocab then
                bad(fname, arg, format("token %d at index %d is outside the vocab [0, %d)", v, i, n_vocab),
                    level + 1)
            end
            buf[i - 1] = v
        end
        return buf, n
    elseif tt == "cdata" then
        local len = cdata_len(toks)
        if len == 0 then
            bad(fname, arg, "expected int32_t cdata, got " .. tostring(ffi_typeof(toks)), level + 1)
        end
        local n = n_given
        if n == nil then
            if len < 0 then
                bad(fname, arg, "an int32_t pointer needs its length in opts.n", level + 1)
            end
            n = len
        elseif type(n) ~= "number" or n ~= floor(n) or n < 0 or (len >= 0 and n > len) then
            bad(fname, "n", format("expected an integer in [0, %s], got %s", len >= 0 and len or "?", show(n)),
                level + 1)
        end
        for i = 0, n - 1 do
            local v = toks[i]
            if v < 0 or v >= n_vocab then
                bad(fname, arg, format("token %d at index %d is outside the vocab [0, %d)", v, i, n_vocab),
                    level + 1)
            end
        end
        return ffi_cast(int32_ptr, toks), n
    end
    bad(fname, arg, "expected a table or int32_t cdata of token ids, got " .. tt, level + 1)
end


-- Results: a Lua table, or with as_cdata an int32_t[n] copy and n.
local function result(buf, n, as_cdata)
    if as_cdata then
        local c = ffi_new(int32_vla, n)
        ffi_copy(c, buf, n * 4)
        return c, n
    end
    local t = new_tab(n, 0)
    for i = 0, n - 1 do
        t[i + 1] = buf[i]
    end
    return t
end


-- ---- generation parameters ----------------------------------------------------------------
--
-- Defaults: args.SAMPLING (shared with the server; docs/prefix-pool.md's
-- max_tokens 128, temperature 1.0, top_k 50), loops 0 (the model's default
-- depth; the reference design's 8 is its own model's), cache_window 0.

local GEN_KEYS = keyset {
    "max_tokens", "loops", "temperature", "top_k", "top_p", "min_p", "repeat_penalty",
    "repeat_last_n", "seed", "ignore_eos", "cache_window", "salt", "no_cache", "as_cdata", "n",
    "pool", "suffix", "n_suffix", "tenant", "priority",
}

local function fill_params(fname, o, level)
    level = level + 1
    check_keys(fname, o, GEN_KEYS, level)
    ffi_copy(gp, default_gp, GP_SIZE)
    gp.max_tokens = opt_int(fname, "max_tokens", o.max_tokens, SAMPLING.max_tokens, 1, level)
    gp.loops = opt_int(fname, "loops", o.loops, 0, 0, level)
    gp.cache_window = opt_int(fname, "cache_window", o.cache_window, 0, 0, level)
    gp.ignore_eos = opt_bool(fname, "ignore_eos", o.ignore_eos, level) and 1 or 0
    gp.no_cache = opt_bool(fname, "no_cache", o.no_cache, level) and 1 or 0
    gp.salt = opt_int(fname, "salt", o.salt, 0, 0, level)
    gp.tenant = opt_int(fname, "tenant", o.tenant, 0, 0, level)
    gp.priority = opt_int(fname, "priority", o.priority, 0, -INT_MAX, level)
    local s = gp_sampling
    s.temperature = opt_num(fname, "temperature", o.temperature, SAMPLING.temperature, level)
    s.top_k = opt_int(fname, "top_k", o.top_k, SAMPLING.top_k, 0, level)
    s.top_p = opt_num(fname, "top_p", o.top_p, SAMPLING.top_p, level)
    s.min_p = opt_num(fname, "min_p", o.min_p, SAMPLING.min_p, level)
    s.repeat_penalty = opt_num(fname, "repeat_penalty", o.repeat_penalty, SAMPLING.repeat_penalty, level)
    s.repeat_last_n = opt_int(fname, "repeat_last_n", o.repeat_last_n, SAMPLING.repeat_last_n, -1, level)
    s.seed = opt_int(fname, "seed", o.seed, SAMPLING.seed, 0, level)
    return gp
end


-- generate_params(opts) -> a tl_generate_params (a new cdata) as generate
-- would fill it from opts: to inspect the defaults (args.SAMPLING).
function _M.generate_params(opts)
    fill_params("generate_params", opt_table("generate_params", opts, 2), 2)
    local p = ffi_new("tl_generate_params")
    ffi_copy(p, gp, GP_SIZE)
    return p
end


-- to_tokens for a prompt or prefix, which must not be empty.
local function nonempty_tokens(self, fname, arg, toks, n_given, level)
    local ptr, n = to_tokens(self, fname, arg, toks, n_given, level + 1)
    if n == 0 then
        bad(fname, arg, arg .. " is empty", level + 1)
    end
    return ptr, n
end


local function check_len(self, fname, n_prompt, level)
    local mt = gp.max_tokens
    if n_prompt + mt > self.max_seq_len then
        bad(fname, "max_tokens", format("prompt length %d + max_tokens %d exceeds max_seq_len %d",
            n_prompt, mt, self.max_seq_len), level + 1)
    end
end


-- A failed tl_request_submit: misuse (a bad argument, a prompt too long,
-- a vocab-only model) raises; a runtime failure (the queue is busy, out
-- of memory) returns nil, message, code.
local function submit_failed(rc, fname, level)
    if rc == S.ERR_TOO_LONG or rc == S.ERR_STATE then
        raise_rc(rc, fname, level + 1)
    end
    return fail_rc(rc, fname, level + 1)
end


-- ---- PrefixPool (lua/tinyloop/pool.lua) --------------------------------------------------

local pool_mod = require "tinyloop.pool"
_M.PrefixPool, _M.PrefixPool_mt = pool_mod.PrefixPool, pool_mod.mt
local is_pool, pool_handle = pool_mod.is_pool, pool_mod.handle
_M.is_pool = is_pool


-- ---- prefix and resume handles ------------------------------------------------------------

local Handle = {}
local handle_mt = { __index = Handle }


local function handle_ptr(hd, fname, level)
    local h = hd.h
    if not h then
        error(format("tinyloop.%s is freed; cannot call %s", hd.kind, fname), level + 1)
    end
    return h
end


-- Wraps a new tl_prefix. The model's state st tracks live handles by
-- address (a plain number: it keeps nothing alive), so that whichever of
-- model and handle is finalized first frees the handle, and only once.
local function new_handle(model, kind, h, n, loops, window)
    local st = model._st
    local addr = tonumber(ffi_cast("uintptr_t", h))
    st.ptrs[addr] = true
    ffi_gc(h, function(p)
        if st.ptrs[addr] then
            st.ptrs[addr] = nil
            C.tl_prefix_free(p)
        end
    end)
    local hd = setmetatable({ h = h, addr = addr, kind = kind, model = model, n = n, loops = loops,
        cache_window = window }, handle_mt)
    st.objs[hd] = true
    return hd
end


-- free(): releases the handle's KV now. Idempotent.
function Handle:free()
    local h = self.h
    if h then
        self.h = nil
        local st = self.model._st
        st.objs[self] = nil
        ffi_gc(h, nil)
        if st.ptrs[self.addr] then
            st.ptrs[self.addr] = nil
            C.tl_prefix_free(h)
        end
    end
end


function Handle:len()
    return self.n
end


function Handle:is_freed()
    return self.h == nil
end


handle_mt.__tostring = function(self)
    return format("tinyloop.%s (%d tokens%s)", self.kind, self.n, self.h and "" or ", freed")
end


-- ---- Model ---------------------------------------------------------------------------------

local Model = {}
local model_mt = { __index = Model }
_M.Model_mt = model_mt

local MODEL_KEYS = keyset {
    "max_seq_len", "n_threads", "kv_mem", "kv_block_size", "kv_type", "loop_start", "loop_end",
    "loop_default", "vocab_only", "kv_dir", "kv_host_mem", "kv_disk_mem", "repack",
}
local REPACK_MODES = { on = true, off = true, bf16 = true }
local KV_ROW = { f16 = true, f32 = true, q8 = true, q4 = true }
local KV_MODES_SHOWN = { "f16", "f32", "q8", "q4", "h:f16", "h:q8" }

local KV_MODE_EXPECTED = "expected a KV mode (\"f16\", \"f32\", \"q8\", \"q4\", \"q8,f16\", \"h\", \"h:q8\")"
_M.KV_MODE_EXPECTED = KV_MODE_EXPECTED

-- A KV mode: "f16" | "f32" | "q8" | "q4", "<k>,<v>" (e.g. "q8,f16") or
-- store-h, "h" / "h:<type>".
local function kv_mode_ok(v)
    if type(v) ~= "string" then return false end
    if v == "h" then return true end
    local ht = v:match("^h:(%w+)$")
    if ht then return KV_ROW[ht] == true end
    local k, rest = v:match("^(%w+)(.*)$")
    if not k or not KV_ROW[k] then return false end
    if rest == "" then return true end
    local vt = rest:match("^,(%w+)$")
    return vt ~= nil and KV_ROW[vt] == true
end
-- for the server, which checks TINYLOOP_KV_TYPE before it opens a model
_M.kv_mode_ok = kv_mode_ok


local function closed(name, level)
    error("tinyloop.Model is closed; cannot call " .. name, level + 1)
end


-- Frees what must not outlive the model in C (prefix and resume
-- handles), forgets stream requests, and closes the model handle.
local function close_state(st, mh)
    for addr in next, st.ptrs do
        st.ptrs[addr] = nil
        C.tl_prefix_free(ffi_cast(prefix_ptr, addr))
    end
    for hd in next, st.objs do
        hd.h = nil
    end
    st.h = nil
    open_states[st.serial] = nil
    C.tl_model_close(mh)
end


-- A byte count option (kv_mem, kv_host_mem, kv_disk_mem): an integer >= 0.
local function opt_bytes(name, v, default)
    if v == nil then
        return default
    end
    if type(v) ~= "number" or v ~= floor(v) or v < 0 or v == math.huge then
        bad("Model", name, "expected a byte count >= 0, got " .. show(v), 3)
    end
    return v
end


-- Model(path, opts): opens a GGUF file. opts: max_seq_len, n_threads,
-- kv_mem (bytes), kv_block_size, kv_type (a KV mode: "f16" | "f32" | "q8" |
-- "q4" | "<k>,<v>" | "h" | "h:<type>"; unset: TINYLOOP_KV_INT8 / _INT4 /
-- _H_MODE, else "f16"), loop_start,
-- loop_end, loop_default, vocab_only; the KV tiers under the arena: kv_dir
-- (a directory of block files, the disk tier, kept across restarts; unset:
-- $TINYLOOP_KV_DIR), kv_host_mem (bytes of host RAM for evicted blocks;
-- 0 or unset: $TINYLOOP_KV_HOST_MEM, else none), kv_disk_mem (the disk
-- tier's budget in bytes; 0 or unset: $TINYLOOP_KV_DISK_MEM, else
-- unlimited); repack ("on" | "off" | "bf16": weight repacking on the CPU,
-- "bf16" lossy and faster, needs AVX512_BF16; unset: $TINYLOOP_REPACK,
-- else "on"). Unset: the C defaults.
function _M.Model(path, opts)
    if type(path) ~= "string" then
        bad("Model", "path", "expected a string, got " .. type(path))
    end
    local o = opt_table("Model", opts, 2)
    check_keys("Model", o, MODEL_KEYS, 2)
    local p = C.tl_model_default_params()
    p.max_seq_len = opt_int("Model", "max_seq_len", o.max_seq_len, p.max_seq_len, 0, 2)
    p.n_threads = opt_int("Model", "n_threads", o.n_threads, p.n_threads, 0, 2)
    p.kv_mem = opt_bytes("kv_mem", o.kv_mem, p.kv_mem)
    p.kv_block_size = opt_int("Model", "kv_block_size", o.kv_block_size, p.kv_block_size, 0, 2)
    if o.kv_type ~= nil then
        if not kv_mode_ok(o.kv_type) then
            bad("Model", "kv_type", KV_MODE_EXPECTED .. ", got " .. show(o.kv_type))
        end
        p.kv_mode = o.kv_type -- o holds the string while tl_model_open reads it
    end
    if o.kv_dir ~= nil then
        if type(o.kv_dir) ~= "string" or o.kv_dir == "" then
            bad("Model", "kv_dir", "expected a directory path (a non-empty string), got " .. show(o.kv_dir))
        end
        p.kv_dir = o.kv_dir -- o holds the string while tl_model_open reads it
    end
    if o.repack ~= nil then
        if not REPACK_MODES[o.repack] then
            bad("Model", "repack", "expected \"on\", \"off\" or \"bf16\", got " .. show(o.repack))
        end
        p.repack = o.repack -- o holds the string while tl_model_open reads it
    end
    p.kv_host_mem = opt_bytes("kv_host_mem", o.kv_host_mem, p.kv_host_mem)
    p.kv_disk_mem = opt_bytes("kv_disk_mem", o.kv_disk_mem, p.kv_disk_mem)
    p.loop_start = opt_int("Model", "loop_start", o.loop_start, p.loop_start, 0, 2)
    p.loop_end = opt_int("Model", "loop_end", o.loop_end, p.loop_end, 0, 2)
    p.loop_default = opt_int("Model", "loop_default", o.loop_default, p.loop_default, 0, 2)
    p.vocab_only = opt_bool("Model", "vocab_only", o.vocab_only, 2) and 1 or 0
    ffi_copy(mparams, p, ffi_sizeof(mparams))

    local rc = C.tl_model_open(path, mparams, model_out)
    if rc ~= 0 then
        raise_rc(rc, "Model", 2)
    end
    local h = model_out[0]
    -- st.h is a second pointer cdata to the model: the finalizer closure
    -- holds st, and st must not hold the finalized cdata itself (a value
    -- of the FFI's weak-keyed finalizer table referring to its key would
    -- keep the model alive forever).
    local st = { h = ffi_cast(model_ptr, ffi_cast("uintptr_t", h)), ptrs = {}, reqs = {},
        objs = setmetatable({}, { __mode = "k" }) }
    serial = serial + 1
    st.serial = serial
    open_states[serial] = st
    ffi_gc(h, function(mh)
        close_state(st, mh)
    end)
    C.tl_model_get_info(h, info_buf)
    local info = info_buf[0]
    local max_seq_len = info.max_seq_len
    local cap = max_seq_len > 256 and max_seq_len or 256
    -- The KV mode is fixed when the model opens, so stats() and the pool's
    -- entry_bytes read these copies instead of asking C each time. Block
    -- bytes are exact (kv_bytes is n_blocks x block_bytes); kv_token_bytes
    -- is that spread over a block's tokens, rounded down by C.
    local blocks = info.kv_blocks_total
    -- The disk tier's directory as C chose it (the option, else the
    -- environment), so callers (the server's warm restart) can tell
    -- whether there is one; nil: none.
    local kv_dir = o.kv_dir
    if kv_dir == nil then
        kv_dir = os.getenv("TINYLOOP_KV_DIR")
        if kv_dir == "" then
            kv_dir = nil
        end
    end
    return setmetatable({
        h = h, _st = st, path = path,
        n_vocab = info.n_vocab, max_seq_len = max_seq_len, bos = info.bos, eos = info.eos,
        loop_default = info.loop_default, vocab_only = o.vocab_only == true, kv_dir = kv_dir,
        _kv_mode = ffi_string(info.kv_mode), _kv_token_bytes = tonumber(info.kv_token_bytes),
        _kv_block_bytes = blocks > 0 and tonumber(info.kv_bytes) / blocks or 0,
        _in = ffi_new(int32_vla, cap), _in_cap = cap,
        _out = ffi_new(int32_vla, cap), _out_cap = cap,
        _chars = ffi_new(char_vla, 1024), _chars_cap = 1024,
    }, model_mt)
end
_M.open = _M.Model


-- close(): frees the model's live prefix/resume handles, then the model.
-- Pools stay valid (they report size 0). Later calls of any other method
-- raise "tinyloop.Model is closed; cannot call <name>"; close() itself is
-- idempotent.
function Model:close()
    local h = self.h
    if not h then
        return
    end
    self.h = nil
    ffi_gc(h, nil)
    close_state(self._st, h)
    setmetatable(self, _M.ClosedModel_mt)
end


function Model:is_closed()
    return self.h == nil
end


-- Bytes per token of each KV mode on this model (capacity planning).
local function kv_mode_bytes(h)
    local t = {}
    for k = 1, #KV_MODES_SHOWN do
        local mode = KV_MODES_SHOWN[k]
        t[mode] = tonumber(C.tl_model_kv_token_bytes(h, mode))
    end
    return t
end

function Model:info()
    local h = self.h or closed("info", 2)
    C.tl_model_get_info(h, info_buf)
    local i = info_buf[0]
    return {
        arch = ffi_string(i.arch), n_vocab = i.n_vocab, n_embd = i.n_embd, n_layer = i.n_layer,
        n_head = i.n_head, n_head_kv = i.n_head_kv, head_dim = i.head_dim, n_ff = i.n_ff,
        n_ctx_train = i.n_ctx_train, max_seq_len = i.max_seq_len, loop_start = i.loop_start,
        loop_end = i.loop_end, loop_default = i.loop_default, rope_freq_base = i.rope_freq_base,
        rope_freq_scale = i.rope_freq_scale, rope_attn_factor = i.rope_attn_factor,
        n_expert = i.n_expert, n_expert_used = i.n_expert_used, n_ff_expert = i.n_ff_expert,
        norm_eps = i.norm_eps, bos = i.bos, eos = i.eos, n_threads = i.n_threads,
        kv_block_size = i.kv_block_size, kv_type = ffi_string(i.kv_mode), kv_store_h = i.kv_store_h == 1,
        kv_token_bytes = tonumber(i.kv_token_bytes), kv_mode_bytes = kv_mode_bytes(h),
        kv_blocks_total = i.kv_blocks_total, kv_blocks_free = i.kv_blocks_free,
        weight_bytes = tonumber(i.weight_bytes), kv_bytes = tonumber(i.kv_bytes),
        isa = i.isa ~= nil and ffi_string(i.isa) or nil,
        max_token_bytes = C.tl_model_max_token_bytes(h),
    }
end


-- kv_blocks(n_tokens [, loops = 0]) -> the KV blocks a sequence of
-- n_tokens positions holds at that loop depth (0: the model's default), and
-- the arena's total. A request whose prompt + max_tokens needs more than
-- the total can never run, whatever else is cached or running: the data to
-- tell that from "KV full right now" (both fail with TL_ERR_KV_FULL). The
-- depth rule is tl_model_depth's: the layers outside the loop block once,
-- the block's layers once per loop.
function Model:kv_blocks(n_tokens, loops)
    local h = self.h or closed("kv_blocks", 2)
    n_tokens = opt_int("kv_blocks", "n_tokens", n_tokens, nil, 0, 2)
    if n_tokens == nil then
        bad("kv_blocks", "n_tokens", "expected an integer >= 0, got nil")
    end
    loops = opt_int("kv_blocks", "loops", loops, 0, 0, 2)
    C.tl_model_get_info(h, info_buf)
    local i = info_buf[0]
    local core = i.loop_end - i.loop_start
    local eff = core == 0 and 1 or (loops > 0 and loops or i.loop_default)
    local depth = i.n_layer - core + core * eff
    local bs = i.kv_block_size
    return floor((n_tokens + bs - 1) / bs) * depth, i.kv_blocks_total
end


local TOK_KEYS = keyset { "add_special", "parse_special", "as_cdata" }

-- tokenize(text, { add_special = true, parse_special = false, as_cdata })
function Model:tokenize(text, opts)
    local h = self.h or closed("tokenize", 2)
    if type(text) ~= "string" then
        bad("tokenize", "text", "expected a string, got " .. type(text))
    end
    local o = opt_table("tokenize", opts, 2)
    check_keys("tokenize", o, TOK_KEYS, 2)
    local add = o.add_special
    if add == nil then
        add = true
    end
    add = opt_bool("tokenize", "add_special", add, 2) and 1 or 0
    local parse = opt_bool("tokenize", "parse_special", o.parse_special, 2) and 1 or 0
    local len = #text
    local n = C.tl_tokenize(h, text, len, add, parse, self._out, self._out_cap)
    if n < 0 then
        -- -(needed) when the buffer is short; a status code (-1..-9) can
        -- not be a need, since the buffer holds at least 256 ids.
        if -n <= self._out_cap then
            raise_rc(n, "tokenize", 2)
        end
        self._out_cap = -n
        self._out = ffi_new(int32_vla, -n)
        n = C.tl_tokenize(h, text, len, add, parse, self._out, self._out_cap)
        if n < 0 then
            raise_rc(n, "tokenize", 2)
        end
    end
    return result(self._out, n, o.as_cdata)
end


-- detokenize(ids [, n]) -> string; control tokens are skipped. n is the
-- length of a cdata array (required for a pointer).
function Model:detokenize(ids, n)
    local h = self.h or closed("detokenize", 2)
    local ptr, len = to_tokens(self, "detokenize", "ids", ids, n, 2)
    local got = C.tl_detokenize(h, ptr, len, self._chars, self._chars_cap)
    if got < 0 then
        if -got <= self._chars_cap then
            raise_rc(got, "detokenize", 2)
        end
        self._chars_cap = -got
        self._chars = ffi_new(char_vla, -got)
        got = C.tl_detokenize(h, ptr, len, self._chars, self._chars_cap)
        if got < 0 then
            raise_rc(got, "detokenize", 2)
        end
    end
    return ffi_string(self._chars, got)
end


-- piece(id) -> the text of one token as it appears in output.
function Model:piece(id)
    local h = self.h or closed("piece", 2)
    if type(id) ~= "number" or id ~= floor(id) or id < 0 or id >= self.n_vocab then
        bad("piece", "id", format("expected a token id in [0, %d), got %s", self.n_vocab, show(id)))
    end
    local got = C.tl_token_to_piece(h, id, self._chars, self._chars_cap)
    if got < 0 then
        self._chars_cap = -got
        self._chars = ffi_new(char_vla, -got)
        got = C.tl_token_to_piece(h, id, self._chars, self._chars_cap)
    end
    return ffi_string(self._chars, got)
end


-- Beam search: generate with opts.beams and/or opts.length_penalty (see
-- tl_generate_beam). opts.pool (a PrefixPool) counts the lookup and lends
-- its salt. Returns what generate returns, then a table { score, logprob,
-- n_generated, finish_reason = "eos" | "length", n_cached, kv_blocks_peak }.
local beam_res = ffi_new("tl_beam_result[1]")
local BEAM_MAX = 1024

local function generate_beam(self, h, prompt, o, level)
    level = level + 1
    local beams = opt_int("generate", "beams", o.beams, 1, 1, level)
    if beams > BEAM_MAX then
        bad("generate", "beams", format("expected an integer in [1, %d], got %s", BEAM_MAX, show(beams)), level)
    end
    local alpha = opt_num("generate", "length_penalty", o.length_penalty, 1.0, level)
    if alpha == math.huge or alpha == -math.huge then
        bad("generate", "length_penalty", "expected a finite number, got " .. show(alpha), level)
    end
    local ph = nil
    if o.pool ~= nil then
        if not is_pool(o.pool) then
            bad("generate", "pool", "expected a tinyloop.PrefixPool, got " .. type(o.pool), level)
        end
        ph = pool_handle(o.pool, "generate", level)
    end
    local rest = {}
    for k, v in next, o do
        if k ~= "beams" and k ~= "length_penalty" then
            rest[k] = v
        end
    end
    local p = fill_params("generate", rest, level)
    local ptr, n = nonempty_tokens(self, "generate", "prompt", prompt, o.n, level)
    check_len(self, "generate", n, level)
    local r = beam_res[0]
    local got = C.tl_generate_beam(h, ph, ptr, n, p, beams, alpha, self._out, self._out_cap, r)
    if got < 0 then
        return fail_rc(got, "generate", level) -- nil, err, code (KV full: out of memory)
    end
    local info = {
        score = r.score, logprob = r.logprob, n_generated = r.n_generated,
        finish_reason = r.finish_reason == C.TL_FINISH_EOS and "eos" or "length",
        n_cached = r.n_cached, kv_blocks_peak = r.kv_blocks_peak,
    }
    if o.as_cdata then
        local c, cn = result(self._out, got, true)
        return c, cn, info
    end
    return result(self._out, got, false), info
end


-- generate(prompt, opts) -> the generated tokens (prompt not included;
-- generation stops at EOS, which is not returned). Runs as tl_generate
-- does (submit, step until done, take) but through the request calls,
-- which take their parameters by pointer: LuaJIT cannot compile a call
-- passing a struct by value, so tl_generate itself would abort the trace.
function Model:generate(prompt, opts)
    local h = self.h or closed("generate", 2)
    local o = opt_table("generate", opts, 2)
    if o.beams ~= nil or o.length_penalty ~= nil then
        local r1, r2, r3 = generate_beam(self, h, prompt, o, 2) -- no tail call: error levels count this frame
        return r1, r2, r3
    end
    local p = fill_params("generate", o, 2)
    local ptr, n = nonempty_tokens(self, "generate", "prompt", prompt, o.n, 2)
    check_len(self, "generate", n, 2)
    local rc = C.tl_request_submit(h, ptr, n, p, nil, id_out)
    if rc ~= 0 then
        local a, msg, code = submit_failed(rc, "generate", 2)
        return a, msg, code
    end
    local id = tonumber(id_out[0])
    local out, cap, total = self._out, self._out_cap, 0
    while true do
        local got = C.tl_request_take(h, id, out + total, cap - total, finished)
        if got < 0 then
            rc = got
            break
        end
        total = total + got
        if finished[0] ~= 0 then
            break
        end
        rc = C.tl_model_step(h)
        if rc < 0 then
            break
        end
    end
    if rc < 0 then
        local a, msg, code = fail_rc(rc, "generate", 2)
        C.tl_request_release(h, id)
        return a, msg, code
    end
    C.tl_request_release(h, id)
    return result(out, total, o.as_cdata)
end


-- register_prefix(pool, tokens, { loops = 0, cache_window = 0, name }) -> n.
-- Prefills tokens once and pins them in pool under (tokens, loops,
-- cache_window); name (a string) labels the entry for pool:entry_bytes(name).
-- Returns #tokens, also when the key is already there (a
-- no-op); returns 0 plus a reason (and code) on invalid arguments (nil
-- pool, no tokens, more than max_seq_len) or a prefix the model cannot
-- build (vocab-only), as docs/prefix-pool.md says; nil, "out of memory: ...", code
-- when the KV arena cannot hold it. Raises on a closed model and on misuse
-- (a pool argument that is not a PrefixPool, a freed pool, ids that are
-- not valid tokens, negative loops/cache_window).
local REG_KEYS = keyset { "loops", "cache_window", "n", "name" }

local function opt_name(fname, v)
    if v ~= nil and type(v) ~= "string" then
        bad(fname, "name", "expected a string, got " .. show(v), 3)
    end
    return v
end

function Model:register_prefix(pool, tokens, opts)
    local h = self.h or closed("register_prefix", 2)
    local o = opt_table("register_prefix", opts, 2)
    check_keys("register_prefix", o, REG_KEYS, 2)
    local loops = opt_int("register_prefix", "loops", o.loops, 0, 0, 2)
    local window = opt_int("register_prefix", "cache_window", o.cache_window, 0, 0, 2)
    local name = opt_name("register_prefix", o.name)
    if pool == nil then
        return 0, "pool is nil"
    end
    if not is_pool(pool) then
        bad("register_prefix", "pool", "expected a tinyloop.PrefixPool, got " .. type(pool))
    end
    local ph = pool_handle(pool, "register_prefix", 2)
    local ptr, n = to_tokens(self, "register_prefix", "tokens", tokens, o.n, 2)
    if n == 0 then
        return 0, "tokens is empty (seq_len 0)"
    end
    if n > self.max_seq_len and not self.vocab_only then
        return 0, format("prefix length %d exceeds max_seq_len %d", n, self.max_seq_len)
    end
    local got = C.tl_pool_register(h, ph, ptr, n, loops, window)
    if got > 0 then
        if name then
            pool_mod.name_entry(pool, name, self, n, loops)
        end
        return got
    end
    -- docs/prefix-pool.md returns 0 for a prefix it cannot take (bad ids, too
    -- long, a vocab-only model or another model's pool); memory and the like are
    -- runtime failures: nil, message, code.
    if got == S.ERR_INVALID_ARG or got == S.ERR_TOO_LONG or got == S.ERR_STATE then
        return 0, lib.last_error(), got
    end
    return fail_rc(got, "register_prefix", 2)
end


-- register_prefix_async(pool, tokens, opts) -> request id: the same
-- registration without waiting for the prefill (for event loops: the
-- engine thread, or the next steps, run it). Poll with request_state(id);
-- "done" means the entry is in the pool. Release the id with
-- release_request(id) when done. opts.name labels the entry at once (its
-- cost does not depend on the prefill), also when the build later fails.
function Model:register_prefix_async(pool, tokens, opts)
    local h = self.h or closed("register_prefix_async", 2)
    local o = opt_table("register_prefix_async", opts, 2)
    check_keys("register_prefix_async", o, REG_KEYS, 2)
    local loops = opt_int("register_prefix_async", "loops", o.loops, 0, 0, 2)
    local window = opt_int("register_prefix_async", "cache_window", o.cache_window, 0, 0, 2)
    local name = opt_name("register_prefix_async", o.name)
    if not is_pool(pool) then
        bad("register_prefix_async", "pool", "expected a tinyloop.PrefixPool, got " .. type(pool))
    end
    local ph = pool_handle(pool, "register_prefix_async", 2)
    local ptr, n = to_tokens(self, "register_prefix_async", "tokens", tokens, o.n, 2)
    if n == 0 then
        bad("register_prefix_async", "tokens", "tokens is empty (seq_len 0)")
    end
    local rc = C.tl_pool_register_submit(h, ph, ptr, n, loops, window, id_out)
    if rc ~= 0 then
        raise_rc(rc, "register_prefix_async", 2)
    end
    if name then
        pool_mod.name_entry(pool, name, self, n, loops)
    end
    return tonumber(id_out[0])
end


local REQ_STATES = { [0] = "queued", [1] = "running", [2] = "done", [3] = "cancelled", [4] = "failed" }

-- request_state(id) -> "queued" | "running" | "done" | "cancelled" |
-- "failed" (then also the reason and its TL_ERR_* code), or nil for an
-- unknown id.
-- Polled on every event-loop tick: its cdata are allocated once, here.
local state_info = ffi_new("tl_request_info[1]")
local state_fin = ffi_new("int[1]")

function Model:request_state(id)
    local h = self.h or closed("request_state", 2)
    if C.tl_request_get_info(h, id, state_info) ~= 0 then
        return nil
    end
    local state = REQ_STATES[state_info[0].state]
    if state == "failed" then
        local rc = C.tl_request_take(h, id, nil, 0, state_fin)
        return state, lib.last_error(), rc < 0 and rc or lib.last_error_code()
    end
    return state
end


-- release_request(id): forgets a request (cancelling it if still running).
function Model:release_request(id)
    local h = self.h or closed("release_request", 2)
    C.tl_request_release(h, id)
end


-- generate_with_pool(pool, prompt, opts) -> prompt + generated tokens.
-- The longest cached prefix of the prompt (a pool entry at the same loops
-- and cache_window, or anything longer the cache holds) is reused; a miss
-- or an internal failure falls through to plain generation.
function Model:generate_with_pool(pool, prompt, opts)
    local h = self.h or closed("generate_with_pool", 2)
    if not is_pool(pool) then
        bad("generate_with_pool", "pool", "expected a tinyloop.PrefixPool, got " .. type(pool))
    end
    local ph = pool_handle(pool, "generate_with_pool", 2)
    local o = opt_table("generate_with_pool", opts, 2)
    local p = fill_params("generate_with_pool", o, 2)
    local ptr, n = nonempty_tokens(self, "generate_with_pool", "prompt", prompt, o.n, 2)
    check_len(self, "generate_with_pool", n, 2)
    local got = C.tl_generate_with_pool(h, ph, ptr, n, p, self._out, self._out_cap)
    if got < 0 then
        return fail_rc(got, "generate_with_pool", 2)
    end
    return result(self._out, got, o.as_cdata)
end


-- build_prefix_cache(tokens, { loops = 0, cache_window = 0 }) -> handle.
-- One prefix prefilled and pinned; free with handle:free() (or the GC;
-- closing the model frees it too).
function Model:build_prefix_cache(tokens, opts)
    local h = self.h or closed("build_prefix_cache", 2)
    local o = opt_table("build_prefix_cache", opts, 2)
    check_keys("build_prefix_cache", o, REG_KEYS, 2)
    local loops = opt_int("build_prefix_cache", "loops", o.loops, 0, 0, 2)
    local window = opt_int("build_prefix_cache", "cache_window", o.cache_window, 0, 0, 2)
    local ptr, n = nonempty_tokens(self, "build_prefix_cache", "tokens", tokens, o.n, 2)
    if n > self.max_seq_len then
        bad("build_prefix_cache", "tokens", format("prefix length %d exceeds max_seq_len %d", n,
            self.max_seq_len))
    end
    local rc = C.tl_prefix_build(h, ptr, n, loops, window, prefix_out)
    if rc ~= 0 then
        return fail_rc(rc, "build_prefix_cache", 2)
    end
    return new_handle(self, "Prefix", prefix_out[0], n, loops, window)
end


local function own_handle(self, fname, hd, kind)
    if type(hd) ~= "table" or getmetatable(hd) ~= handle_mt or hd.kind ~= kind then
        bad(fname, "handle", format("expected a tinyloop.%s, got %s", kind, type(hd)), 2)
    end
    if hd.model ~= self then
        bad(fname, "handle", format("the tinyloop.%s belongs to another model", kind), 2)
    end
    return handle_ptr(hd, fname, 2)
end


-- generate_from_prefix_cache(prefix, { suffix = tokens, ... }) -> generated
-- tokens. loops and cache_window come from the prefix.
function Model:generate_from_prefix_cache(prefix, opts)
    local h = self.h or closed("generate_from_prefix_cache", 2)
    local ph = own_handle(self, "generate_from_prefix_cache", prefix, "Prefix")
    local o = opt_table("generate_from_prefix_cache", opts, 2)
    local p = fill_params("generate_from_prefix_cache", o, 2)
    local ptr, n = nil, 0
    if o.suffix ~= nil then
        ptr, n = to_tokens(self, "generate_from_prefix_cache", "suffix", o.suffix, o.n_suffix, 2)
    end
    check_len(self, "generate_from_prefix_cache", prefix.n + n, 2)
    local got = C.tl_generate_from_prefix(h, ph, ptr, n, p, self._out, self._out_cap)
    if got < 0 then
        return fail_rc(got, "generate_from_prefix_cache", 2)
    end
    return result(self._out, got, o.as_cdata)
end


-- build_resume_handle(prompt) -> handle. For looped models: keeps the
-- depth-independent part of the prompt's forward pass so resume_generate
-- can run it at any loops recomputing only the loop block and coda.
function Model:build_resume_handle(prompt, opts)
    local h = self.h or closed("build_resume_handle", 2)
    local o = opt_table("build_resume_handle", opts, 2)
    local ptr, n = nonempty_tokens(self, "build_resume_handle", "prompt", prompt, o.n, 2)
    if n >= self.max_seq_len then
        bad("build_resume_handle", "prompt", format("prompt length %d leaves no room under max_seq_len %d",
            n, self.max_seq_len))
    end
    local rc = C.tl_resume_build(h, ptr, n, prefix_out)
    if rc ~= 0 then
        return fail_rc(rc, "build_resume_handle", 2)
    end
    return new_handle(self, "Resume", prefix_out[0], n, nil, 0)
end


-- resume_generate(handle, opts) -> generated tokens, at opts.loops.
function Model:resume_generate(handle, opts)
    local h = self.h or closed("resume_generate", 2)
    local ph = own_handle(self, "resume_generate", handle, "Resume")
    local o = opt_table("resume_generate", opts, 2)
    local p = fill_params("resume_generate", o, 2)
    check_len(self, "resume_generate", handle.n, 2)
    local got = C.tl_resume_generate(h, ph, p, self._out, self._out_cap)
    if got < 0 then
        return fail_rc(got, "resume_generate", 2)
    end
    return result(self._out, got, o.as_cdata)
end


-- Streams: each is a table { st, id, done, guard, pool }; stream_next is
-- one module-level function (creating closures per stream would abort
-- the caller's trace: FNEW is not compiled). A stream dropped before its
-- end is released by its guard's finalizer, which finds the model's state
-- by serial number (request ids restart at 1 per model, addresses are
-- reused) and does nothing once the model is closed.
local stream_guard_t = ffi_typeof("struct { int64_t id; int64_t serial; }")

local function stream_gc(g)
    local st = open_states[tonumber(g.serial)]
    local id = tonumber(g.id)
    if st and st.reqs[id] then
        st.reqs[id] = nil
        C.tl_request_release(st.h, id)
    end
end


local function stream_finish(s)
    s.done = true
    ffi_gc(s.guard, nil)
    local st, id = s.st, s.id
    if st.h and st.reqs[id] then
        st.reqs[id] = nil
        C.tl_request_release(st.h, id)
    end
end


local function stream_next(s)
    if s.done then
        return nil
    end
    local mh = s.st.h
    if not mh then
        s.done = true
        closed("stream", 2)
    end
    local id = s.id
    while true do
        local got = C.tl_request_take(mh, id, one_tok, 1, finished)
        if got > 0 then
            return one_tok[0]
        end
        if got < 0 then
            stream_finish(s)
            raise_rc(got, "stream", 2)
        end
        if finished[0] ~= 0 then
            stream_finish(s)
            return nil
        end
        local r = C.tl_model_step(mh)
        if r < 0 then
            stream_finish(s)
            raise_rc(r, "stream", 2)
        end
    end
end
_M.stream_next = stream_next


-- Submits a stream's request: stream_next, its state; or nil, err, code
-- when the request cannot be submitted (runtime failure). fname names the
-- public method in messages; misuse raises at the caller of that method.
local function open_stream(self, fname, prompt, opts, level)
    level = level + 1
    local h = self.h or closed(fname, level)
    local o = opt_table(fname, opts, level)
    local p = fill_params(fname, o, level)
    local pool, ph = o.pool, nil
    if pool ~= nil then
        if not is_pool(pool) then
            bad(fname, "pool", "expected a tinyloop.PrefixPool, got " .. type(pool), level)
        end
        ph = pool_handle(pool, fname, level)
    end
    local ptr, n = nonempty_tokens(self, fname, "prompt", prompt, o.n, level)
    check_len(self, fname, n, level)
    local rc = C.tl_request_submit(h, ptr, n, p, ph, id_out)
    if rc ~= 0 then
        return submit_failed(rc, fname, level)
    end
    local id = tonumber(id_out[0])
    local st = self._st
    st.reqs[id] = true
    local guard = ffi_new(stream_guard_t)
    guard.id = id
    guard.serial = st.serial
    ffi_gc(guard, stream_gc)
    return stream_next, { st = st, id = id, done = false, guard = guard, pool = pool }
end


-- stream(prompt, opts) -> iterator, state: generated token ids as they
-- are produced, one scheduler step at a time (tl_request_submit /
-- tl_model_step / tl_request_take):
--   for tok in model:stream(prompt, opts) do ... end
-- opts as generate, plus pool = a PrefixPool whose statistics count the
-- lookup. Several streams on one model interleave: each step advances
-- all of them. A stream dropped early is released by the GC or close().
-- A request that cannot be submitted (the queue is busy, out of memory)
-- returns nil, err, code instead of an iterator: check it before the loop
-- where that can happen (local it, st, code = model:stream(p, o)). A
-- failure once the iteration runs raises (a for loop sees one value).
function Model:stream(prompt, opts)
    local a, b, c = open_stream(self, "stream", prompt, opts, 2) -- no tail call: levels count this frame
    return a, b, c
end


-- set_tenant_budget(tenant, max_blocks): per-tenant KV budget (0 = none);
-- tenant_blocks(tenant) -> blocks its cache entries hold.
function Model:set_tenant_budget(tenant, blocks)
    local h = self.h or closed("set_tenant_budget", 2)
    local rc = C.tl_model_set_tenant_budget(h, opt_int("set_tenant_budget", "tenant", tenant, 0, 0, 2),
        opt_int("set_tenant_budget", "blocks", blocks, 0, 0, 2))
    if rc ~= 0 then
        raise_rc(rc, "set_tenant_budget", 2)
    end
end


function Model:tenant_blocks(tenant)
    local h = self.h or closed("tenant_blocks", 2)
    local n = C.tl_model_tenant_blocks(h, opt_int("tenant_blocks", "tenant", tenant, 0, 0, 2))
    if n < 0 then
        raise_rc(n, "tenant_blocks", 2)
    end
    return n
end


-- cache_nodes() -> the radix tree's nodes (depth first) as an array of
-- tables with the fields of tl_cache_node (ids as numbers, flags as booleans).
function Model:cache_nodes()
    local h = self.h or closed("cache_nodes", 2)
    local n = C.tl_model_cache_nodes(h, nil, 0)
    if n < 0 then
        raise_rc(n, "cache_nodes", 2)
    end
    local buf = ffi_new("tl_cache_node[?]", n + 1)
    n = math.min(n, C.tl_model_cache_nodes(h, buf, n + 1))
    local out = {}
    for i = 0, n - 1 do
        local c = buf[i]
        out[i + 1] = {
            id = tonumber(c.id), parent = tonumber(c.parent), start = c.start, n_tokens = c.n_tokens,
            n_blocks = c.n_blocks, hits = tonumber(c.hits), last_access = tonumber(c.last_access),
            tenant = c.tenant, pinned = c.pinned ~= 0, locked = c.locked ~= 0, leaf = c.leaf ~= 0,
            shareable = c.shareable ~= 0, loops = c.loops, cache_window = c.cache_window,
            salt = tonumber(c.salt),
        }
    end
    return out
end


-- stream_close(state): ends a stream early (the state is the second value
-- stream() returns): its request is cancelled and released at once, rather
-- than running on until the stream is garbage-collected.
function Model:stream_close(state)
    local _ = self.h or closed("stream_close", 2)
    if type(state) ~= "table" or not state.guard then
        bad("stream_close", "state", "expected the state returned by stream()")
    end
    if not state.done then
        stream_finish(state)
    end
end


-- stream_text(prompt, opts) -> iterator over text pieces as tokens are
-- produced. A multi-byte character split across tokens is held back until
-- it completes, so every piece is whole UTF-8 (invalid bytes pass through
-- rather than being held forever). Pieces are raw token texts: the leading
-- space SentencePiece adds is kept. Options as stream(); like stream(), a
-- request that cannot be submitted returns nil, err, code.
local function text_next(t)
    local s, dec, one = t.s, t.dec, t.one
    while true do
        local tok = stream_next(s)
        if tok == nil then
            local held, partial = dec:finish()
            local rest = held .. partial
            return rest ~= "" and rest or nil
        end
        one[1] = t.model:piece(tok)
        local text = dec:push(one, 1)
        if text ~= "" then
            return text
        end
    end
end


function Model:stream_text(prompt, opts)
    local _, s, code = open_stream(self, "stream_text", prompt, opts, 2)
    if not _ then
        return nil, s, code
    end
    -- the decoder the server's SSE path uses
    return text_next, { s = s, dec = textstream.new(nil), one = {}, model = self }
end


-- stats() -> the model's cache statistics (tl_cache_stats) as a table,
-- with the KV mode in use (kv_mode, its canonical name as info().kv_type)
-- and kv_token_bytes (KV bytes per token over all layers at the default
-- loops), so a dashboard reading stats can turn blocks into bytes.
function Model:stats()
    local h = self.h or closed("stats", 2)
    C.tl_model_get_stats(h, stats_buf)
    local s = stats_buf[0]
    return {
        lookups = tonumber(s.lookups), hits = tonumber(s.hits), hit_tokens = tonumber(s.hit_tokens),
        prefill_tokens = tonumber(s.prefill_tokens),
        prefill_tokens_saved = tonumber(s.prefill_tokens_saved),
        generated_tokens = tonumber(s.generated_tokens),
        requests_finished = tonumber(s.requests_finished), evictions = tonumber(s.evictions),
        evicted_tokens = tonumber(s.evicted_tokens), nodes = tonumber(s.nodes),
        cached_tokens = tonumber(s.cached_tokens), blocks_total = s.blocks_total,
        blocks_free = s.blocks_free, blocks_used = s.blocks_used, blocks_shared = s.blocks_shared,
        requests_active = s.requests_active,
        kv_mode = self._kv_mode, kv_token_bytes = self._kv_token_bytes,
        tiers = _M.tier_stats(s),
    }
end


-- tier_stats(s) -> the KV tiers of a tl_cache_stats as a table: host and
-- disk, each { blocks, bytes, budget, spills, spill_bytes, hits,
-- restore_bytes, refused, dropped, spill_ms, restore_ms } (budget 0: no
-- host tier / an unlimited disk tier), plus restored_tokens (prompt tokens
-- a restore served) and recomputed (restores skipped as dearer than
-- prefill). Shared with the server's engine snapshot.
local function tier(s, i)
    return {
        blocks = tonumber(s.tier_blocks[i]), bytes = tonumber(s.tier_bytes[i]),
        budget = tonumber(s.tier_budget[i]), spills = tonumber(s.tier_spills[i]),
        spill_bytes = tonumber(s.tier_spill_bytes[i]), hits = tonumber(s.tier_hits[i]),
        restore_bytes = tonumber(s.tier_restore_bytes[i]), refused = tonumber(s.tier_refused[i]),
        dropped = tonumber(s.tier_dropped[i]), spill_ms = tonumber(s.tier_spill_ms[i]),
        restore_ms = tonumber(s.tier_restore_ms[i]),
    }
end


function _M.tier_stats(s)
    return { host = tier(s, 0), disk = tier(s, 1), restored_tokens = tonumber(s.tier_restored_tokens),
        recomputed = tonumber(s.tier_recomputed) }
end


-- set_evict_weights{ recency = 1, hits = 0, tokens = 0, depth = 0 }: the
-- cache's eviction score (lowest first), pushed from an eviction policy.
local EVICT_KEYS = keyset { "recency", "hits", "tokens", "depth" }

function Model:set_evict_weights(w)
    local h = self.h or closed("set_evict_weights", 2)
    if type(w) ~= "table" then
        bad("set_evict_weights", "weights", "expected a table, got " .. type(w))
    end
    check_keys("set_evict_weights", w, EVICT_KEYS, 2)
    local rc = C.tl_model_set_evict_weights(h,
        opt_num("set_evict_weights", "recency", w.recency, 0, 2),
        opt_num("set_evict_weights", "hits", w.hits, 0, 2),
        opt_num("set_evict_weights", "tokens", w.tokens, 0, 2),
        opt_num("set_evict_weights", "depth", w.depth, 0, 2))
    if rc ~= 0 then
        raise_rc(rc, "set_evict_weights", 2)
    end
end


-- set_spill_policy{ min_tokens = 0, min_hits = 0 }: what happens to a node
-- evicted from the arena when the model has KV tiers: one with at least
-- min_tokens tokens and min_hits hits spills down a tier, others are
-- dropped. { 0, 0 } spills everything (the default). Without tiers it is
-- kept for nothing. Pushed from an eviction policy's spill table.
local SPILL_KEYS = keyset { "min_tokens", "min_hits" }

function Model:set_spill_policy(sp)
    local h = self.h or closed("set_spill_policy", 2)
    if type(sp) ~= "table" then
        bad("set_spill_policy", "policy", "expected a table, got " .. type(sp))
    end
    check_keys("set_spill_policy", sp, SPILL_KEYS, 2)
    local rc = C.tl_model_set_spill_policy(h,
        opt_int("set_spill_policy", "min_tokens", sp.min_tokens, 0, 0, 2),
        opt_int("set_spill_policy", "min_hits", sp.min_hits, 0, 0, 2))
    if rc ~= 0 then
        raise_rc(rc, "set_spill_policy", 2)
    end
end


local function opt_dir(fname, dir)
    if dir ~= nil and (type(dir) ~= "string" or dir == "") then
        bad(fname, "dir", "expected a directory path (a non-empty string) or nil, got " .. show(dir), 3)
    end
    return dir
end


-- save_cache([dir]) -> blocks written: every cached prefix's full blocks
-- (all namespaces, pinned pool entries included) as block files in dir
-- (nil: the model's kv_dir), for a warm restart; files already there are
-- kept (and not counted). nil, err, code on an I/O failure; raises without
-- a directory (neither dir nor kv_dir) or with a dir other than the disk
-- tier's. It takes the compute lock and, with an engine thread, waits for
-- the step boundary: call it off the request path (exit_worker, a timer).
function Model:save_cache(dir)
    local h = self.h or closed("save_cache", 2)
    local n = C.tl_model_save_cache(h, opt_dir("save_cache", dir))
    if n < 0 then
        return fail_rc(n, "save_cache", 2)
    end
    if dir and not self.kv_dir then
        self.kv_dir = dir -- a model without a disk tier adopts dir
    end
    return n
end


-- load_cache([dir]) -> { files, loaded, refused, why = { lines } }: indexes
-- dir's block files as the disk tier (nil: rescans the model's kv_dir; a
-- model without one adopts dir). A file of another model, KV mode, block
-- size or format, a truncated one or one whose checksum fails is refused,
-- one line in why naming the file and the reason, and never loaded; the
-- rest of the directory loads. Blocks come up when a prompt matches them.
-- nil, err, code on an I/O failure; misuse raises as save_cache.
local load_rep = ffi_new("tl_cache_load_report[1]")

function Model:load_cache(dir)
    local h = self.h or closed("load_cache", 2)
    local rc = C.tl_model_load_cache(h, opt_dir("load_cache", dir), load_rep)
    if rc < 0 then
        return fail_rc(rc, "load_cache", 2)
    end
    if dir and not self.kv_dir then
        self.kv_dir = dir
    end
    local r = load_rep[0]
    local why = {}
    for line in ffi_string(r.why):gmatch("[^\n]+") do
        why[#why + 1] = line
    end
    return { files = r.files, loaded = r.loaded, refused = r.refused, why = why }
end


-- chat_format, chat, chat_template, set_chat_template (lua/tinyloop/chat.lua)
require("tinyloop.chat").install(Model, { C = C, closed = closed, bad = bad, raise_rc = raise_rc,
    opt_table = opt_table, char_vla = char_vla, open_stream = open_stream, stream_next = stream_next })


model_mt.__tostring = function(self)
    return format("tinyloop.Model (%s)", self.path)
end


-- A closed model: every method raises, close() does nothing.
local closed_stubs = {}
for name, fn in next, Model do
    if type(fn) == "function" then
        closed_stubs[name] = function()
            error("tinyloop.Model is closed; cannot call " .. name, 2)
        end
    end
end
closed_stubs.close = function() end
closed_stubs.is_closed = function() return true end
_M.ClosedModel_mt = {
    __index = closed_stubs,
    __tostring = function(self)
        return format("tinyloop.Model (%s, closed)", rawget(self, "path"))
    end,
}


-- now() -> seconds on a monotonic clock.
function _M.now()
    return C.tl_clock()
end


function _M.is_model(x)
    if type(x) ~= "table" then
        return false
    end
    local mt = getmetatable(x)
    return mt == model_mt or mt == _M.ClosedModel_mt
end


return _M
