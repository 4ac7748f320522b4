-- tinyloop.server - an engine instance inside nginx: OpenAI-compatible
-- HTTP handlers over the engine thread (see DESIGN.md, "Serving").
--
--   init_worker_by_lua_block { require("tinyloop.server").init_worker{ model = "m.gguf" } }
--   location / { content_by_lua_block { require("tinyloop.server").handle() } }
--
-- Requests never block the event loop: a handler tokenizes, submits
-- (tl_request_submit copies and returns), then waits on its semaphore,
-- which the notifier timer posts when the engine writes the request's id;
-- it pulls new tokens with tl_request_take and streams them out.
-- luacheck: globals ngx
local ffi = require "ffi"
local bit = require "bit"
local cjson = require "cjson.safe"
local tl = require "tinyloop"
local eng = require "tinyloop.server_engine"
local oa = require "tinyloop.server_openai"
local metrics = require "tinyloop.server_metrics"
local lru = require "tinyloop.lru"
local textstream = require "tinyloop.textstream"
local fill_sampling = require("tinyloop.args").fill_sampling
local show = require("tinyloop.args").show

local C = require("tinyloop.lib").load()
local ffi_new = ffi.new
local ngx_now, update_time = ngx.now, ngx.update_time
local ngx_print, ngx_flush, ngx_log, ERR = ngx.print, ngx.flush, ngx.log, ngx.ERR
local format, concat, tonumber, type, pcall = string.format, table.concat, tonumber, type, pcall
local byte, bor, bxor = string.byte, bit.bor, bit.bxor
local min = math.min

local _M = { _VERSION = "0.1.0" }

-- tl_generate_params.tenant arrived with per-tenant budgets; older builds lack it.
local HAS_TENANT = pcall(ffi.offsetof, "tl_generate_params", "tenant")
    and ffi.offsetof("tl_generate_params", "tenant") ~= nil

local cfg = {}        -- options given to init_worker
local model, engine
local pin_system_prompt -- defined below; used by the handlers
local default_gp = nil
local tok_buf = nil   -- take scratch: consumed before any yield
local TOK_CAP = 256
local in_flight = 0
local serial = 0


-- ---- tenants -------------------------------------------------------------------------------
--
-- resolve_tenant(api_key, headers) -> tenant | nil, message. A tenant is
-- { name, id (int >= 0), salt (int), priority (int) }. The policy runtime
-- replaces this with _M.set_tenant_resolver(fn); without one, cfg.tenants
-- (a table keyed by API key, or a Lua file returning one) decides, and no
-- tenants configured means open access as the default tenant.

local DEFAULT_TENANT = { name = "default", id = 0, salt = 0, priority = 0 }
local tenants = nil
local resolver = nil
local reload_counter = nil
-- Set when tenants are configured but did not load: every request is then
-- refused (503) instead of falling back to open access as the default tenant.
local auth_broken = nil


-- same_key(a, b): compares two keys in time that depends on their length
-- only, so a caller cannot find a key byte by byte from response times.
local function same_key(a, b)
    if type(a) ~= "string" or type(b) ~= "string" or #a ~= #b then
        return false
    end
    local d = 0
    for i = 1, #a do
        d = bor(d, bxor(byte(a, i), byte(b, i)))
    end
    return d == 0
end
_M.same_key = same_key


local function load_tenants(t)
    if type(t) == "string" then
        local chunk, err = loadfile(t)
        if not chunk then
            return nil, err
        end
        setfenv(chunk, {})
        local ok, v = pcall(chunk)
        if not ok or type(v) ~= "table" then
            return nil, "tenants file " .. t .. " must return a table: " .. tostring(v)
        end
        t = v
    end
    local out = {}
    local n = 0
    for key, v in pairs(t or {}) do
        if type(key) ~= "string" or key == "" or type(v) ~= "table" then
            return nil, "tenants: each entry must be [\"api-key\"] = { name = ... }, got ["
                .. tostring(key) .. "] = " .. type(v)
        end
        n = n + 1
        out[key] = {
            name = v.name or key, id = v.id or n, priority = v.priority or 0,
            salt = v.salt or (v.isolate == false and 0 or tonumber(ngx.crc32_long(v.name or key))),
            system = v.system, allow_system = v.allow_system,
        }
    end
    return out
end


function _M.set_tenant_resolver(fn)
    resolver = fn
end


function _M.set_reload_counter(fn)
    reload_counter = fn
end


function _M.resolve_tenant(key, headers)
    if auth_broken then
        return nil, "The server's tenant configuration failed to load; no request is served.", 503
    end
    if resolver then
        return resolver(key, headers)
    end
    if not tenants then
        return DEFAULT_TENANT
    end
    if not key then
        return nil, "You didn't provide an API key. Provide it in the Authorization header (Bearer <key>)."
    end
    local t = tenants[key]
    if not t then
        return nil, "Incorrect API key provided."
    end
    return t
end


local function bearer()
    local h = ngx.var.http_authorization
    if not h then
        return nil
    end
    return h:match("^%s*[Bb]earer%s+(%S+)")
end


-- The tenants policy (lua/policies/tenants.lua shape, run by the policy
-- runtime lua/tinyloop/policy.lua) when cfg.tenants_policy names a file:
-- worker 0 watches the file and publishes a good new version through the
-- lua_shared_dict version counter; every worker syncs from the dict, so an
-- edit reloads in all workers, and a broken edit keeps the old version.
local policy_rt = nil
local check_tenant = nil
local tids, n_tids = nil, 0 -- tenant name -> { tid, budget }, bounded (new_tenant_tables)
local pinned = nil          -- pinned system prompts, bounded the same way (below)


-- A tenant dropped from the table (the least recently seen, once
-- cfg.max_tenants are known): its budget goes; its cached blocks stay
-- charged to its old id until evicted, and it gets a new id if it returns.
local function drop_tenant(_, t)
    if t.budget and model then
        C.tl_model_set_tenant_budget(model.h, t.tid, 0)
    end
end


-- The integer C uses for a tenant (stable while the tenant stays in the
-- table). Ids are not reused (a returning tenant must not inherit another's
-- cached blocks); after 2^31 - 2 of them they wrap, long after the old
-- holders' cache is gone.
local function tid_of(id, budget)
    local t = tids:get(id)
    if not t then
        n_tids = n_tids % 2147483646 + 1
        t = { tid = n_tids }
        tids:set(id, t)
        if type(budget) == "number" and budget > 0 and model then
            -- posts a message the engine applies between steps: never waits for one
            if C.tl_model_set_tenant_budget(model.h, t.tid, math.min(math.floor(budget), 2 ^ 31 - 1)) ~= 0 then
                ngx_log(ngx.WARN, "tinyloop: kv_budget of tenant ", id, ": ", require("tinyloop.lib").last_error())
            else
                t.budget = budget
            end
        end
    end
    return t.tid
end


local function policy_resolve(key, headers)
    if not policy_rt.current then
        return nil, "The tenants policy did not load; no request is served.", 503
    end
    local v = policy_rt:acquire()
    local ok, t = v:call("resolve", { api_key = key, headers = headers })
    local version = v.version
    policy_rt:release(v)
    local no_key = "You didn't provide an API key. Provide it in the Authorization header (Bearer <key>)."
    if ok and t == nil then
        return nil, key and "Incorrect API key provided." or no_key     -- no tenant for this request
    end
    local bad = not ok and t or (type(t) ~= "table" and "resolve returned " .. type(t)) or check_tenant(t)
    if bad then
        ngx_log(ERR, "tinyloop: tenants policy resolve failed: ", bad)
        return nil, "The tenants policy failed to resolve this request.", 500
    end
    -- A tenant with an api_key is reached with that key only, whatever the
    -- policy says; a request with a key must resolve to that key's tenant.
    if t.api_key ~= nil or key then
        if not same_key(key, t.api_key) then
            return nil, key and "Incorrect API key provided." or no_key
        end
    end
    local id = tostring(t.id or "default")
    local salt = 0
    if t.salt == true then
        salt = require("tinyloop.policy.tenants").salt_of(id) -- the tenants policy's own salts
    elseif type(t.salt) == "number" then
        salt = t.salt
    end
    local system = t.system
    if type(system) == "table" then
        system = table.concat(system, "\n")
    end
    return {
        name = id, id = tid_of(id, t.kv_budget), salt = salt, priority = t.priority or 0,
        system = type(system) == "string" and system ~= "" and system or nil,
        allow_system = t.allow_system,
        max_tokens = type(t.limits) == "table" and t.limits.max_tokens or nil,
        max_prompt = type(t.limits) == "table" and t.limits.max_prompt or nil,
        policy_version = version,
    }
end


local function policy_tick(premature)
    if premature or not policy_rt then
        return
    end
    local dict = ngx.shared.tinyloop
    if ngx.worker.id() == 0 and policy_rt:maybe_reload() and dict then
        policy_rt:publish(dict)
    end
    if dict then
        policy_rt:sync(dict)
    end
end


local function start_policy(path)
    local ok, policy = pcall(require, "tinyloop.policy")
    if not ok then
        return nil, "the policy runtime is not available: " .. tostring(policy)
    end
    check_tenant = policy.check_tenant
    -- lazy: a file that does not load leaves no version, and requests are
    -- refused (503) until a good version loads here or is published.
    local rok, rt = pcall(policy.Runtime, { path = path, kind = "tenants", interval_ms = 500,
        name = "tenants", lazy = true, log = function(msg, level)
            ngx_log(level == "warn" and ngx.WARN or ngx.NOTICE, msg)
        end })
    if not rok then
        return nil, rt
    end
    rt:reload()
    policy_rt = rt
    resolver = policy_resolve
    reload_counter = function()
        return math.max(0, policy_rt.reloads_ok - 1)
    end
    local dict = ngx.shared.tinyloop
    if dict then
        -- a worker (re)started after edits takes the published version
        policy_rt:sync(dict)
    end
    ngx.timer.every(0.5, policy_tick)
    return true
end


function _M.policy_runtime()
    return policy_rt
end


-- ---- pinned tenant system prompts -----------------------------------------------------------
--
-- The first time this worker sees a tenant's system prompt it registers the
-- prompt's rendered turn in a pool of the tenant's own (its salt and id),
-- without waiting: the engine thread runs the prefill as a request, so the
-- event loop never computes. Once pinned, the prompt survives eviction; the
-- radix cache serves it to every request that starts with it either way.
-- At most cfg.max_tenants prompts stay pinned: the least recently used one
-- is released (its pool freed by the engine between steps, unpinning the
-- entry, which the cache then evicts like any other), so a policy deriving
-- tenants from request data cannot grow pools without bound.
local function unpin(_, p)
    if p.id and model then
        model:release_request(p.id) -- cancels a registration still in flight
    end
    if p.pool then
        p.pool:free()
    end
end


local function new_tenant_tables(cap)
    tids = lru.new(cap, drop_tenant)
    pinned = lru.new(cap, unpin) -- key -> { pool, id } (id nil once the registration ended)
end
new_tenant_tables(1024)


-- kind "chat" pins the system turn as chat requests render it (the same
-- tl_chat_tokenize path, so the ids are a prefix of theirs); "completion"
-- pins the raw prefix /v1/completions puts before the prompt.
local system_prefix_ids -- defined with tokenize() below


function pin_system_prompt(tenant, kind)
    kind = kind or "chat"
    local key = kind .. "\0" .. tenant.name .. "\0" .. tostring(tenant.salt) .. "\0" .. tenant.system
    local p = pinned:get(key)
    if p then
        if p.id and model:request_state(p.id) ~= "queued" and model:request_state(p.id) ~= "running" then
            model:release_request(p.id) -- the registration ended: forget its request
            p.id = nil
        end
        return
    end
    if not model then
        return
    end
    local ok, err = pcall(function()
        local pool = tl.PrefixPool(1)
        if tenant.salt and tenant.salt ~= 0 then
            pool:set_salt(tenant.salt)
        end
        if tenant.id and tenant.id > 0 then
            pool:set_tenant(tenant.id)
        end
        local toks
        if kind == "chat" then
            toks = model:chat_tokenize({ { role = "system", content = tenant.system } }, { add_assistant = false })
        else
            toks = system_prefix_ids(tenant.system)
        end
        if #toks == 0 or #toks >= model.max_seq_len then
            pinned:set(key, { pool = pool })
            return
        end
        pinned:set(key, { pool = pool, id = model:register_prefix_async(pool, toks) })
    end)
    if not ok then
        pinned:set(key, {}) -- do not retry on every request
        ngx_log(ngx.WARN, "tinyloop: cannot pin the system prompt of tenant ", tenant.name, ": ", tostring(err))
    end
end


-- ---- init ----------------------------------------------------------------------------------

-- Why the engine is not up (nil once it is), and when the next load is
-- tried: /health reports both. A model that fails to load (a file not yet
-- in place, memory short) is retried with doubling delays, so a worker
-- started too early recovers instead of answering 503 until restarted.
local load_state = { attempts = 0 }


-- The model's KV mode and its cost, for /metrics and /health: fixed
-- once the model is open.
local kv_info = nil


local function open_engine(opts, msl)
    load_state.attempts = load_state.attempts + 1
    local ok, m = pcall(tl.Model, cfg.model, { max_seq_len = msl, kv_mem = opts.kv_mem,
        n_threads = opts.n_threads, kv_type = opts.kv_type, kv_dir = opts.kv_dir,
        kv_host_mem = opts.kv_host_mem, kv_disk_mem = opts.kv_disk_mem })
    if not ok then
        return nil, "cannot open model " .. cfg.model .. ": " .. tostring(m)
    end
    if m.kv_dir then
        -- A warm start: the engine indexed the directory when the model
        -- opened; the report says what it refused, a line per file. Read
        -- before the engine thread starts, so it waits for no step.
        local rep, rerr = m:load_cache()
        if not rep then
            ngx_log(ngx.WARN, "tinyloop: kv_dir ", m.kv_dir, ": ", rerr)
        else
            ngx_log(rep.refused > 0 and ngx.WARN or ngx.NOTICE, "tinyloop: kv_dir ", m.kv_dir, ": ",
                rep.loaded, " block files loaded, ", rep.refused, " refused")
            for i = 1, #rep.why do
                ngx_log(ngx.WARN, "tinyloop: kv_dir refused ", rep.why[i])
            end
            if rep.refused > #rep.why then -- the engine's report holds the first lines only
                ngx_log(ngx.WARN, "tinyloop: kv_dir refused ", rep.refused - #rep.why, " more files")
            end
        end
    end
    local mi = m:info()
    kv_info = { mode = mi.kv_type, token_bytes = mi.kv_token_bytes }
    if opts.chat_template then
        local tok, terr = pcall(m.set_chat_template, m, opts.chat_template)
        if not tok then
            ngx_log(ERR, "tinyloop: chat_template: ", terr)
        end
    end
    local e, err = eng.start(m, { max_queue = opts.max_queue, sock_dir = opts.sock_dir })
    if not e then
        m:close()
        return nil, err
    end
    model, engine = m, e
    cfg.model_name = opts.model_name or cfg.model:match("([^/]+)%.gguf$") or cfg.model
    local pol = opts.tenants_policy or os.getenv("TINYLOOP_TENANTS_POLICY")
    if pol and pol ~= "" then
        local pok, perr = start_policy(pol)
        if not pok then
            auth_broken = perr
            ngx_log(ERR, "tinyloop: tenants policy ", pol, ": ", perr)
        end
    end
    load_state.reason, load_state.next_at = nil, nil
    return true
end


local function load_with_retry(opts, msl)
    local ok, err = open_engine(opts, msl)
    if ok then
        if load_state.attempts > 1 then
            ngx_log(ngx.NOTICE, "tinyloop: model ", cfg.model, " loaded on attempt ", load_state.attempts)
        end
        return
    end
    local delay = math.min(cfg.model_retry_min * 2 ^ (load_state.attempts - 1), cfg.model_retry_max)
    update_time()
    load_state.reason, load_state.next_at = err, ngx_now() + delay
    ngx_log(ERR, "tinyloop: ", err, "; retry ", load_state.attempts + 1, " in ", delay, " s")
    local tok, terr = ngx.timer.at(delay, function(premature)
        if not premature and not engine then
            load_with_retry(opts, msl)
        end
    end)
    if not tok then
        ngx_log(ERR, "tinyloop: cannot schedule the model retry: ", terr)
        load_state.next_at = nil
    end
end


-- The KV tier options after the environment: a variable that is set wins
-- (the byte counts then go to the engine as 0, which reads the variable
-- with its suffix). A bad option is a configuration error, not retried:
-- returns the reason.
local function kv_tier_opts(opts)
    local dir = os.getenv("TINYLOOP_KV_DIR")
    if dir and dir ~= "" then
        opts.kv_dir = dir
    elseif opts.kv_dir ~= nil and (type(opts.kv_dir) ~= "string" or opts.kv_dir == "") then
        return "bad kv_dir: expected a directory path, got " .. show(opts.kv_dir)
    end
    for _, k in ipairs { "kv_host_mem", "kv_disk_mem" } do
        local env = os.getenv("TINYLOOP_" .. k:upper())
        local v = opts[k]
        if env and env ~= "" then
            opts[k] = nil
        elseif v ~= nil and (type(v) ~= "number" or v < 0 or v % 1 ~= 0 or v == math.huge) then
            return format("bad %s: expected a byte count >= 0, got %s", k, show(v))
        end
    end
end


-- exit_worker(): exit_worker_by_lua. With a disk tier, writes the cache to
-- it (model:save_cache(), which waits for the engine's step boundary: the
-- worker is exiting, no request waits on it) so that the next worker,
-- after a reload or a restart, finds the prefixes this one held.
function _M.exit_worker()
    if not (model and model.kv_dir) or model:is_closed() then
        return
    end
    update_time()
    local t0 = ngx_now()
    local ok, n, err = pcall(model.save_cache, model) -- a raise here must not stop the exit
    update_time()
    if not ok then
        n, err = nil, n
    end
    if n then
        ngx_log(ngx.NOTICE, "tinyloop: kv_dir ", model.kv_dir, ": ", n, " blocks written at exit in ",
            format("%.0f", (ngx_now() - t0) * 1e3), " ms")
    else
        ngx_log(ERR, "tinyloop: kv_dir ", model.kv_dir, ": cannot save the cache: ", err)
    end
end


-- init_worker(opts): opts.model (GGUF path; default $TINYLOOP_MODEL), max_seq_len
-- ($TINYLOOP_MAX_SEQ_LEN), kv_mem, n_threads, max_queue, model_name, instance
-- ($TINYLOOP_INSTANCE), tenants (table or Lua file; $TINYLOOP_TENANTS),
-- tenants_policy (a tenants policy file, hot-reloaded; $TINYLOOP_TENANTS_POLICY),
-- retry_after (seconds, 503s), max_tokens_cap (default completion length for chat),
-- model_retry_min / model_retry_max (seconds between load attempts after a
-- failure: doubling from 1 up to 30), max_tenants (tenants this worker keeps
-- ids and pinned system prompts for, least recently used dropped; 1024).
-- request_timeout (seconds from arrival to the last token; 600).
-- chat_template (force "gemma", "chatml", "llama3", "llama2", "phi3", "phi4", "mistral-v7",
-- "mistral-v1", "mistral-v3", "mistral-v3-tekken", "falcon3", "granite", "deepseek3", "command-r"
-- or "plain"),
-- tokenize_inline_bytes (prompts up to this size tokenize in the handler, larger
-- ones on the tokenizer thread; default 4096).
-- metrics_key (Bearer key for /metrics and /health details; $TINYLOOP_METRICS_KEY).
-- kv_type (the KV cache mode: "f16", "f32", "q8", "q4", "q8,f16", "h", "h:q8", ...;
-- unset: the engine reads $TINYLOOP_KV_INT8 / _INT4 / _H_MODE, else f16).
-- The KV tiers under the arena: kv_dir (a directory of block files: evicted
-- prefixes go there and come back on a match, and it survives reloads and
-- restarts), kv_host_mem (bytes of host RAM for evicted blocks; none by
-- default), kv_disk_mem (the directory's budget in bytes; unlimited). With
-- a kv_dir, exit_worker() writes the cache there and the next worker logs
-- what it refused (a WARN line per file); registered system prompts are
-- written through when registered.
-- $TINYLOOP_MAX_QUEUE, $TINYLOOP_KV_MEM, $TINYLOOP_KV_TYPE, $TINYLOOP_KV_DIR,
-- $TINYLOOP_KV_HOST_MEM and $TINYLOOP_KV_DISK_MEM (the byte counts with a K,
-- M, G or T suffix; read by the engine) override max_queue, kv_mem, kv_type,
-- kv_dir, kv_host_mem and kv_disk_mem.
function _M.init_worker(opts)
    opts = opts or {}
    cfg = opts
    cfg.model = opts.model or os.getenv("TINYLOOP_MODEL")
    cfg.instance = opts.instance or os.getenv("TINYLOOP_INSTANCE") or "tinyloop"
    cfg.retry_after = opts.retry_after or 1
    cfg.max_tokens_cap = opts.max_tokens_cap or 256
    cfg.model_retry_min = opts.model_retry_min or 1
    cfg.model_retry_max = opts.model_retry_max or 30
    local mt = opts.max_tenants or os.getenv("TINYLOOP_MAX_TENANTS")
    cfg.max_tenants = tonumber(mt) or 1024
    if mt and not (tonumber(mt) and cfg.max_tenants >= 1 and cfg.max_tenants % 1 == 0) then
        ngx_log(ERR, "tinyloop: max_tenants must be an integer >= 1, got ", tostring(mt), "; using 1024")
        cfg.max_tenants = 1024
    end
    new_tenant_tables(cfg.max_tenants)
    cfg.metrics_key = opts.metrics_key or os.getenv("TINYLOOP_METRICS_KEY")
    if cfg.metrics_key == "" then
        cfg.metrics_key = nil
    end
    opts.max_queue = tonumber(os.getenv("TINYLOOP_MAX_QUEUE") or "") or opts.max_queue
    opts.kv_mem = tonumber(os.getenv("TINYLOOP_KV_MEM") or "") or opts.kv_mem
    local msl = opts.max_seq_len or tonumber(os.getenv("TINYLOOP_MAX_SEQ_LEN") or "")
    default_gp = C.tl_generate_default_params()
    tok_buf = ffi_new("int32_t[?]", TOK_CAP)
    if not cfg.model then
        load_state.reason = "no model configured (set TINYLOOP_MODEL or pass model =)"
        ngx_log(ERR, "tinyloop: ", load_state.reason)
        return
    end
    -- A bad KV mode is a configuration error: checked here, naming where it
    -- came from, and not retried (every attempt would fail the same way).
    local kv_env = os.getenv("TINYLOOP_KV_TYPE")
    if kv_env == "" then
        kv_env = nil
    end
    opts.kv_type = kv_env or opts.kv_type
    if opts.kv_type ~= nil and not tl.kv_mode_ok(opts.kv_type) then
        load_state.reason = format("bad %s: %s, got %s", kv_env and "TINYLOOP_KV_TYPE" or "kv_type",
            tl.KV_MODE_EXPECTED, show(opts.kv_type))
        ngx_log(ERR, "tinyloop: ", load_state.reason)
        return
    end
    local why = kv_tier_opts(opts)
    if why then
        load_state.reason = why
        ngx_log(ERR, "tinyloop: ", why)
        return
    end
    local t = opts.tenants or os.getenv("TINYLOOP_TENANTS")
    if t and t ~= "" then
        local err
        tenants, err = load_tenants(t)
        if not tenants then
            auth_broken = err
            ngx_log(ERR, "tinyloop: ", err)
        end
    end
    load_with_retry(opts, msl)
end


function _M.engine()
    return engine, model
end


-- ---- helpers --------------------------------------------------------------------------------

local function json_reply(status, body)
    ngx.status = status
    ngx.header["Content-Type"] = "application/json"
    ngx.header["X-Tinyloop-Instance"] = cfg.instance
    ngx.say(body)
end


local function fail(endpoint, status, message, param, code, headers)
    metrics.request(endpoint, status)
    ngx.header["X-Tinyloop-Instance"] = cfg.instance
    return oa.send_error(status, message, param, code, headers)
end


local function read_body()
    ngx.req.read_body()
    local data = ngx.req.get_body_data()
    if data then
        return data
    end
    local file = ngx.req.get_body_file()
    if not file then
        return nil
    end
    local f = io.open(file, "rb")
    if not f then
        return nil
    end
    data = f:read("*a")
    f:close()
    return data
end


-- ---- tokenization ----------------------------------------------------------------------------
--
-- Text is refused by its size before it is tokenized: no token covers more
-- than max_token_bytes input bytes, so text longer than the token limit x
-- that cannot fit. What passes is tokenized inline when small, else on the
-- model's tokenizer thread (server_engine tokenize), so a megabyte of prompt
-- never stalls this worker's event loop. Chat messages go through
-- tl_chat_tokenize: only the template's markers become control tokens.
local max_token_bytes = nil


local function byte_bound(bytes, limit, what, field)
    max_token_bytes = max_token_bytes or C.tl_model_max_token_bytes(model.h)
    if max_token_bytes > 0 and bytes > limit * max_token_bytes then
        local whose = limit < model.max_seq_len and "This tenant's prompt limit"
            or "This model's maximum context length"
        return format("%s is %d tokens. However, your %s has %d bytes, more than %d tokens can hold (no token of "
            .. "this model covers more than %d bytes). Please reduce the length of the %s.", whose, limit, what,
            bytes, limit, max_token_bytes, what), field
    end
end


local function ids_from_table(t, from)
    local n = #t - from + 1
    local arr = ffi_new("int32_t[?]", math.max(n, 1))
    for i = from, #t do
        arr[i - from] = t[i]
    end
    return arr, n
end


-- Text ids (cdata, n) | nil, message, rc: inline or as a tokenize job.
local function text_ids(text, add_special)
    if #text <= (cfg.tokenize_inline_bytes or 4096) then
        local ok, ids, n = pcall(model.tokenize, model, text, { add_special = add_special, as_cdata = true })
        if not ok then
            return nil, tostring(ids)
        end
        return ids, n
    end
    return engine:tokenize(text, { add_special = add_special })
end


-- BOS (as the vocab says) and the tenant's system prompt followed by a blank
-- line: what /v1/completions puts before a tenant's prompt, as a table.
-- Memoized per prompt text (bounded: cleared when full), since every
-- completion of the tenant needs it.
local prefix_memo, n_prefix_memo = {}, 0
function system_prefix_ids(system)
    local ids = prefix_memo[system]
    if ids then
        return ids
    end
    ids = model:tokenize(system .. "\n\n", { add_special = true })
    if #ids > 1 and ids[#ids] == model.eos then
        ids[#ids] = nil
    end
    if n_prefix_memo >= 256 then
        prefix_memo, n_prefix_memo = {}, 0
    end
    prefix_memo[system], n_prefix_memo = ids, n_prefix_memo + 1
    return ids
end


-- A failed tokenize job: 503 when the tokenizer queue is full, else 400.
local function job_failed(message, rc, field)
    if rc == eng.ERR_BUSY then
        metrics.inc("tinyloop_requests_rejected_total")
        return nil, "The server is overloaded; retry later. (" .. message .. ")", nil, "server_overloaded", 503
    end
    return nil, message, field, "invalid_value"
end


-- tokenize(o, tenant) -> ids (int32_t cdata), n | nil, message, field, code [, status]
local function tokenize(o, tenant, chat)
    local limit = math.min(model.max_seq_len, tenant.max_prompt or model.max_seq_len)
    local ids, n, err, rc
    if o.messages then
        -- content bytes bound the tokens from below; each turn (not system,
        -- which some templates fold) renders at least one token of its own
        local bytes, turns = 0, 0
        for i = 1, #o.messages do
            bytes = bytes + #o.messages[i].content
            turns = turns + (o.messages[i].role ~= "system" and 1 or 0)
        end
        err = byte_bound(bytes, limit, "prompt", "messages")
        if not err and turns > limit then
            err = format("The prompt has %d turns, more than the %d tokens it may hold.", turns, limit)
        end
        if err then
            return nil, err, "messages", "context_length_exceeded"
        end
        -- the rendered text is longer by the template's markers
        if bytes + 32 * #o.messages <= (cfg.tokenize_inline_bytes or 4096) then
            local ok
            ok, ids, n = pcall(model.chat_tokenize, model, o.messages, { as_cdata = true })
            if not ok then
                return nil, tostring(ids), "messages", "invalid_value"
            end
        else
            ids, n, rc = engine:tokenize(o.messages, { chat = true })
        end
        if not ids then
            return job_failed(n, rc, "messages")
        end
        return ids, n
    end
    local prefix = not chat and tenant.system and system_prefix_ids(tenant.system)
    if o.prompt_ids then
        local p = o.prompt_ids
        for i = 1, #p do
            if p[i] >= model.n_vocab then
                return nil, format("Invalid value for 'prompt': token %d at index %d is outside the vocab [0, %d)",
                    p[i], i - 1, model.n_vocab), "prompt", "invalid_value"
            end
        end
        ids, n = ids_from_table(p, prefix and p[1] == model.bos and 2 or 1)
    else
        err = byte_bound(#o.prompt, limit, "prompt", "prompt")
        if err then
            return nil, err, "prompt", "context_length_exceeded"
        end
        -- with a tenant prefix, the prompt is tokenized as it would be alone
        -- (no BOS: the prefix has it), so the prefix's ids stay a prefix
        ids, n, rc = text_ids(o.prompt, not prefix)
        if not ids then
            return job_failed(n, rc, "prompt")
        end
    end
    if prefix then
        local np = #prefix
        local all = ffi_new("int32_t[?]", np + n)
        for i = 1, np do
            all[i - 1] = prefix[i]
        end
        ffi.copy(all + np, ids, n * 4)
        ids, n = all, np + n
    end
    return ids, n
end


-- Scratch: tl_request_submit copies the parameters before it returns, and
-- nothing yields between filling them and the submit.
local submit_params = ffi_new("tl_generate_params")
local GP_SIZE = ffi.sizeof("tl_generate_params")

local function fill_params(o, tenant)
    local p = submit_params
    ffi.copy(p, default_gp, GP_SIZE)
    p.max_tokens = o.max_tokens
    p.salt = tenant.salt or 0
    p.priority = tenant.priority or 0
    if HAS_TENANT then
        p.tenant = tenant.id or 0
    end
    -- the library's defaults (args.SAMPLING); an unset seed is random
    local s = fill_sampling(p.sampling, o)
    if not o.seed then
        s.seed = math.random(1, 2 ^ 31)
    end
    return p
end


-- ---- generation -----------------------------------------------------------------------------

-- Runs one request to its end. r: { id, stream, chat, stop, ... }.
-- Writes SSE chunks when streaming; fills r.text, r.finish, r.n_completion.
local function run(r)
    local id = r.id
    local sema = engine:semaphore(id)
    local dec = textstream.new(r.stop) -- UTF-8 and stop strings, as stream_text
    local text = {}        -- non-stream: the text pieces
    local parts = {}
    local n_tok, last, first = 0, nil, true
    local deadline = r.t0 + (cfg.request_timeout or 600)
    local expired = false
    while true do
        local n, fin_or_err, rc = engine:take(id, tok_buf, TOK_CAP)
        if not n then
            r.error, r.error_rc = fin_or_err, rc
            break
        end
        if n > 0 then
            update_time()
            local now = ngx_now()
            if not last then
                r.t_first = now
                metrics.ttft(now - r.t0)
            else
                local d = (now - last) / n
                for _ = 1, n do
                    metrics.itl(d)
                end
            end
            last = now
            for i = 0, n - 1 do
                parts[i + 1] = model:piece(tok_buf[i])
            end
            local out, used = dec:push(parts, n)
            n_tok = n_tok + used
            r.stopped = dec.stopped or nil
            if r.stream then
                if out ~= "" then
                    ngx_print(oa.chunk(r, r.chat, out, nil, first))
                    first = false
                    ngx_flush(false)
                end
            else
                text[#text + 1] = out
            end
            if r.stopped then
                engine:cancel(id)
                break
            end
        end
        if fin_or_err then
            break
        end
        if expired then
            engine:cancel(id)
            r.error = format("request timed out after %g s", cfg.request_timeout or 600)
            r.timed_out = true
            break
        end
        sema:wait(1)
        -- Seen after a wait, so one more take sends what the engine made
        -- before the deadline; a request is never ended before its first
        -- wait (at a tiny timeout it would race the first token).
        expired = ngx_now() > deadline
    end
    local held = dec:finish() -- an incomplete last character is dropped
    if held ~= "" then
        if r.stream then
            ngx_print(oa.chunk(r, r.chat, held, nil, first))
            first = false
        else
            text[#text + 1] = held
        end
    end
    r.first_sent = not first
    r.text = concat(text)
    r.n_completion = n_tok
    local info = engine:info(id)
    if info then
        r.n_prompt = info.n_prompt
        r.n_cached = info.n_cached
        r.finish = r.stopped and "stop" or oa.FINISH[info.finish_reason] or "stop"
    else
        r.finish = r.stopped and "stop" or "length"
    end
end


-- The HTTP status, code and param of a failed generation (r.error set).
-- KV exhaustion is 503 (retry later) unless the request can never fit:
-- its prompt + max_tokens needs more blocks than the whole arena holds
-- (then 400: lower max_tokens). Decided from the code and the sizes
-- (model:kv_blocks), never from the message. The request timeout is 504.
local function failure_status(r)
    if r.timed_out then
        return 504, "request_timeout"
    end
    if r.error_rc == eng.ERR_KV_FULL then
        local need, total = model:kv_blocks(r.n_prompt + r.max_tokens)
        if (r.n_completion or 0) == 0 and need > total then
            return 400, "kv_capacity_exceeded", "max_tokens"
        end
        return 503, "kv_cache_full"
    end
    return 500, "engine_error"
end
_M._failure_status = failure_status


local function generate(endpoint, chat)
    update_time()
    local t0 = ngx_now()
    if ngx.req.get_method() ~= "POST" then
        return fail(endpoint, 405, "Only POST is allowed on " .. endpoint .. ".", nil, "method_not_allowed")
    end
    if not engine then
        return fail(endpoint, 503, "The model is not loaded.", nil, "model_not_loaded",
            { ["Retry-After"] = cfg.retry_after })
    end
    local tenant, terr, tstatus = _M.resolve_tenant(bearer(), ngx.req.get_headers())
    if not tenant then
        if tstatus then
            return fail(endpoint, tstatus, terr, nil, "tenant_policy_error")
        end
        return fail(endpoint, 401, terr, nil, "invalid_api_key")
    end
    local body, derr = oa.decode(read_body())
    if not body then
        return fail(endpoint, 400, derr, nil, "invalid_json")
    end
    update_time()
    local t_parsed = ngx_now()
    local o, verr, field = (chat and oa.chat_request or oa.completion_request)(body)
    if not o then
        return fail(endpoint, 400, verr, field, field and "invalid_value")
    end
    if o.model and o.model ~= cfg.model_name then
        return fail(endpoint, 404, format("The model '%s' does not exist; this server serves '%s'.", o.model,
            cfg.model_name), "model", "model_not_found")
    end
    if chat then
        -- The operator's system prompt stays first; a client's system
        -- messages follow it, or are refused where the tenant says so.
        for i, m in ipairs(o.messages) do
            if m.role == "system" and tenant.allow_system == false then
                return fail(endpoint, 400, "System messages are not allowed for this API key.",
                    format("messages[%d].role", i - 1), "system_not_allowed")
            end
        end
        if tenant.system then
            table.insert(o.messages, 1, { role = "system", content = tenant.system })
            pin_system_prompt(tenant, "chat")
        end
    elseif tenant.system then
        pin_system_prompt(tenant, "completion")
    end
    local arr, n, tfield, tcode, tstatus2 = tokenize(o, tenant, chat)
    if not arr then
        return fail(endpoint, tstatus2 or 400, n, tfield, tcode or "invalid_value",
            tstatus2 and { ["Retry-After"] = cfg.retry_after })
    end
    local msl = model.max_seq_len
    if o.max_tokens_default then
        -- completions default to OpenAI's 16; chat (unlimited at OpenAI) to the cap
        o.max_tokens = math.max(1, min(o.max_tokens or cfg.max_tokens_cap, tenant.max_tokens or cfg.max_tokens_cap,
            cfg.max_tokens_cap, msl - n))
    elseif tenant.max_tokens and o.max_tokens > tenant.max_tokens then
        return fail(endpoint, 400, format("Invalid value for 'max_tokens': %d exceeds this tenant's limit of %d.",
            o.max_tokens, tenant.max_tokens), "max_tokens", "invalid_value")
    end
    if tenant.max_prompt and n > tenant.max_prompt then
        return fail(endpoint, 400, format("The prompt has %d tokens; this tenant's limit is %d.", n,
            tenant.max_prompt), chat and "messages" or "prompt", "context_length_exceeded")
    end
    if n + o.max_tokens > msl then
        return fail(endpoint, 400, format("This model's maximum context length is %d tokens. However, you "
            .. "requested %d tokens (%d in the prompt, %d for the completion). Please reduce the "
            .. "length of the prompt or the completion.", msl, n + o.max_tokens, n, o.max_tokens),
            chat and "messages" or "prompt", "context_length_exceeded")
    end
    update_time()
    local t_prepared = ngx_now()
    local id, serr, rc = engine:submit(arr, n, fill_params(o, tenant))
    if not id then
        if rc == eng.ERR_BUSY then
            metrics.inc("tinyloop_requests_rejected_total")
            return fail(endpoint, 503, "The server is overloaded; retry later. (" .. serr .. ")", nil,
                "server_overloaded", { ["Retry-After"] = cfg.retry_after })
        elseif rc == eng.ERR_TOO_LONG or rc == eng.ERR_INVALID_ARG then
            return fail(endpoint, 400, serr, chat and "messages" or "prompt", "invalid_value")
        end
        return fail(endpoint, 500, serr, nil, "engine_error")
    end
    serial = serial + 1
    local r = {
        id = id, chat = chat, stream = o.stream, stop = o.stop, t0 = t0, created = ngx.time(),
        rid = format("%s-%s-%d", chat and "chatcmpl" or "cmpl", cfg.instance, serial),
        model = cfg.model_name, n_prompt = n, max_tokens = o.max_tokens, n_cached = 0, usage_in_stream = true,
    }
    in_flight = in_flight + 1
    local released = false
    local function cleanup()
        if not released then
            released = true
            in_flight = in_flight - 1
            engine:release(id)
        end
    end
    local ok_abort = ngx.on_abort(function()
        metrics.inc("tinyloop_requests_cancelled_total")
        engine:cancel(id)
        cleanup()
        metrics.request(endpoint, 499)
        return ngx.exit(499)
    end)
    r.abortable = ok_abort
    if o.stream then
        ngx.header["Content-Type"] = "text/event-stream"
        ngx.header["Cache-Control"] = "no-cache"
        ngx.header["X-Accel-Buffering"] = "no"
        ngx.header["X-Tinyloop-Instance"] = cfg.instance
    end
    local ok, err = pcall(run, r)
    cleanup()
    if not ok then
        ngx_log(ERR, "tinyloop: request failed: ", err)
        r.error = tostring(err)
    end
    if r.error then
        -- A failure is never reported as a success: before the first byte
        -- an error status; mid-stream (the 200 header is gone) an error
        -- event in the OpenAI shape and no [DONE]. Both count as failed.
        local status, code, param = failure_status(r)
        local msg = "generation failed: " .. r.error
        metrics.inc(format('tinyloop_requests_failed_total{endpoint="%s",reason="%s"}', endpoint, code))
        if not (o.stream and r.first_sent) then
            return fail(endpoint, status, msg, param, code,
                status == 503 and { ["Retry-After"] = cfg.retry_after } or nil)
        end
        metrics.request(endpoint, status)
        metrics.inc("tinyloop_completion_tokens_total", r.n_completion)
        ngx_print("data: ", oa.error_body(status, msg, param, code), "\n\n")
        ngx_flush(true)
        return
    end
    if r.stopped then
        metrics.inc("tinyloop_stop_string_finishes_total")
    end
    metrics.inc("tinyloop_prompt_tokens_total", r.n_prompt)
    metrics.inc("tinyloop_completion_tokens_total", r.n_completion)
    metrics.inc("tinyloop_cached_prompt_tokens_total", r.n_cached)
    metrics.request(endpoint, 200)
    if o.stream then
        ngx_print(oa.chunk(r, chat, nil, r.finish, not r.first_sent))
        ngx_print("data: [DONE]\n\n")
        ngx_flush(true)
        return
    end
    -- where a request's time went (ms; ngx.now resolution): reading and
    -- decoding the body, validating and tokenizing, then the engine (queue,
    -- prefill, first token, its notification) and the rest of the generation
    update_time()
    local t_end = ngx_now()
    ngx.header["Server-Timing"] = format("parse;dur=%d, prepare;dur=%d, first_token;dur=%d, total;dur=%d",
        (t_parsed - t0) * 1000 + 0.5, (t_prepared - t_parsed) * 1000 + 0.5,
        ((r.t_first or t_end) - t_prepared) * 1000 + 0.5, (t_end - t0) * 1000 + 0.5)
    json_reply(200, chat and oa.chat(r) or oa.completion(r))
end


-- ---- endpoints ------------------------------------------------------------------------------

function _M.completions()
    return generate("/v1/completions", false)
end


function _M.chat_completions()
    return generate("/v1/chat/completions", true)
end


function _M.models()
    metrics.request("/v1/models", 200)
    json_reply(200, cjson.encode({ object = "list", data = { {
        id = cfg.model_name or "none", object = "model", created = 0, owned_by = "tinyloop" } } }))
end


-- metrics_allowed(): /metrics and the details of /health are for the
-- operator: with $TINYLOOP_METRICS_KEY set they need it as a Bearer token;
-- without it /metrics is open (bind it to a private listener, see
-- examples/nginx.conf) and /health says only whether it serves.
local function metrics_allowed()
    return cfg.metrics_key == nil or same_key(bearer(), cfg.metrics_key)
end


-- With details, and without an engine: why (the load error) and seconds to
-- the next load attempt.
-- health(opts): opts.details = true shows the details without the key (for
-- a location on a private listener, see examples/nginx.conf).
function _M.health(opts)
    local up = engine ~= nil and not auth_broken and not (policy_rt and not policy_rt.current)
    local status = up and 200 or 503
    if not (opts and opts.details) and not (cfg.metrics_key and metrics_allowed()) then
        return json_reply(status, cjson.encode({ status = up and "ok" or "unavailable" }))
    end
    local st = engine and engine:stats()
    json_reply(status, cjson.encode({
        status = up and "ok" or "unavailable", instance = cfg.instance, in_flight = in_flight,
        queued = st and st.requests_queued or 0, running = st and st.requests_active or 0,
        notify = engine and engine.notify_mode or cjson.null, pid = ngx.worker.pid(),
        policy = policy_rt and policy_rt.current and policy_rt.current.version or cjson.null,
        kv_mode = kv_info and kv_info.mode or cjson.null,
        reason = not engine and (load_state.reason or "the model is loading") or nil,
        retry_in = not engine and load_state.next_at
            and math.floor(math.max(0, load_state.next_at - ngx_now()) * 10 + 0.5) / 10 or nil,
    }))
end


function _M.metrics()
    if not metrics_allowed() then
        return fail("/metrics", 401, "/metrics needs the metrics key (Authorization: Bearer "
            .. "$TINYLOOP_METRICS_KEY).", nil, "invalid_api_key")
    end
    local st = engine and engine:stats()
    ngx.header["Content-Type"] = "text/plain; version=0.0.4"
    ngx.print(metrics.render(st, {
        in_flight = in_flight,
        policy_reloads = reload_counter and reload_counter() or 0,
        pinned_pools = pinned:count(), tenant_ids = tids:count(),
        kv_mode = kv_info and kv_info.mode, kv_token_bytes = kv_info and kv_info.token_bytes,
        tiers = st and st.tiers,
    }))
end


local ROUTES_KNOWN = { ["/v1/completions"] = true, ["/v1/chat/completions"] = true }


function _M.too_large()
    metrics.request(ROUTES_KNOWN[ngx.var.uri] and ngx.var.uri or "other", 413)
    ngx.status = 413
    ngx.header["Content-Type"] = "application/json"
    ngx.say(oa.error_body(413, "Request body too large (client_max_body_size).", nil,
        "request_too_large"))
end


local ROUTES = {
    ["/v1/completions"] = _M.completions,
    ["/v1/chat/completions"] = _M.chat_completions,
    ["/v1/models"] = _M.models,
    ["/health"] = _M.health,
    ["/metrics"] = _M.metrics,
}


-- One content handler for every path.
function _M.handle()
    local f = ROUTES[ngx.var.uri]
    if not f then
        return fail("other", 404, "Unknown path " .. ngx.var.uri .. ".", nil, "not_found")
    end
    return f()
end


return _M
