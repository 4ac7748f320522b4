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
            system = v.system,
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
local tids, n_tids = {}, 0


-- The small integer C uses for a tenant (stable within this worker).
local function tid_of(id, budget)
    local t = tids[id]
    if not t then
        n_tids = n_tids + 1
        t = n_tids
        tids[id] = t
        if budget and budget > 0 and model then
            C.tl_model_set_tenant_budget(model.h, t, budget)
        end
    end
    return t
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
        name = "tenants", lazy = true, log = function(msg)
            ngx_log(msg:find("rejected", 1, true) and ngx.WARN or ngx.NOTICE, msg)
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
local pinned = {}   -- key -> { pool, id } (id nil once the registration ended)


function pin_system_prompt(tenant)
    local key = tenant.name .. "\0" .. tostring(tenant.salt) .. "\0" .. tenant.system
    local p = pinned[key]
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
        local text = model:chat_format({ { role = "system", content = tenant.system } }, { add_assistant = false })
        local toks = model:tokenize(text, { parse_special = true })
        if #toks == 0 or #toks >= model.max_seq_len then
            pinned[key] = { pool = pool }
            return
        end
        pinned[key] = { pool = pool, id = model:register_prefix_async(pool, toks) }
    end)
    if not ok then
        pinned[key] = {} -- do not retry on every request
        ngx_log(ngx.WARN, "tinyloop: cannot pin the system prompt of tenant ", tenant.name, ": ", tostring(err))
    end
end


-- ---- init ----------------------------------------------------------------------------------

-- init_worker(opts): opts.model (GGUF path; default $TINYLOOP_MODEL), max_seq_len
-- ($TINYLOOP_MAX_SEQ_LEN), kv_mem, n_threads, max_queue, model_name, instance
-- ($TINYLOOP_INSTANCE), tenants (table or Lua file; $TINYLOOP_TENANTS),
-- tenants_policy (a tenants policy file, hot-reloaded; $TINYLOOP_TENANTS_POLICY),
-- retry_after (seconds, 503s), max_tokens_cap (default completion length for chat),
-- metrics_key (Bearer key for /metrics and /health details; $TINYLOOP_METRICS_KEY).
-- $TINYLOOP_MAX_QUEUE and $TINYLOOP_KV_MEM override max_queue and kv_mem.
function _M.init_worker(opts)
    opts = opts or {}
    cfg = opts
    cfg.model = opts.model or os.getenv("TINYLOOP_MODEL")
    cfg.instance = opts.instance or os.getenv("TINYLOOP_INSTANCE") or "tinyloop"
    cfg.retry_after = opts.retry_after or 1
    cfg.max_tokens_cap = opts.max_tokens_cap or 256
    cfg.metrics_key = opts.metrics_key or os.getenv("TINYLOOP_METRICS_KEY")
    if cfg.metrics_key == "" then
        cfg.metrics_key = nil
    end
    opts.max_queue = tonumber(os.getenv("TINYLOOP_MAX_QUEUE") or "") or opts.max_queue
    opts.kv_mem = tonumber(os.getenv("TINYLOOP_KV_MEM") or "") or opts.kv_mem
    local msl = opts.max_seq_len or tonumber(os.getenv("TINYLOOP_MAX_SEQ_LEN") or "")
    if not cfg.model then
        ngx_log(ERR, "tinyloop: no model (set TINYLOOP_MODEL or pass model =)")
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
    local ok, m = pcall(tl.Model, cfg.model, { max_seq_len = msl, kv_mem = opts.kv_mem,
        n_threads = opts.n_threads })
    if not ok then
        ngx_log(ERR, "tinyloop: cannot open model ", cfg.model, ": ", m)
        return
    end
    model = m
    cfg.model_name = opts.model_name or cfg.model:match("([^/]+)%.gguf$") or cfg.model
    local e, err = eng.start(model, { max_queue = opts.max_queue, sock_dir = opts.sock_dir })
    if not e then
        ngx_log(ERR, "tinyloop: ", err)
        return
    end
    engine = e
    local pol = opts.tenants_policy or os.getenv("TINYLOOP_TENANTS_POLICY")
    if pol and pol ~= "" then
        local pok, perr = start_policy(pol)
        if not pok then
            auth_broken = perr
            ngx_log(ERR, "tinyloop: tenants policy ", pol, ": ", perr)
        end
    end
    default_gp = C.tl_generate_default_params()
    tok_buf = ffi_new("int32_t[?]", TOK_CAP)
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


local function tokenize(o)
    if o.prompt_ids then
        local ids = o.prompt_ids
        for i = 1, #ids do
            if ids[i] >= model.n_vocab then
                return nil, format("Invalid value for 'prompt': token %d at index %d is outside the vocab [0, %d)",
                    ids[i], i - 1, model.n_vocab), "prompt"
            end
        end
        return ids
    end
    if o.messages then
        local text, err = engine:chat_format(o.messages)
        if not text then
            return nil, err, "messages"
        end
        local ids = model:tokenize(text, { add_special = true, parse_special = true })
        if ids[2] == model.bos and ids[1] == model.bos then
            table.remove(ids, 1)
        end
        return ids
    end
    return model:tokenize(o.prompt, { add_special = true })
end


local function fill_params(o, tenant)
    local p = ffi_new("tl_generate_params")
    ffi.copy(p, default_gp, ffi.sizeof(p))
    p.max_tokens = o.max_tokens
    p.salt = tenant.salt or 0
    p.priority = tenant.priority or 0
    if HAS_TENANT then
        p.tenant = tenant.id or 0
    end
    local s = p.sampling
    s.temperature = o.temperature
    s.top_k = o.top_k or (o.temperature > 0 and 50 or 0)
    s.top_p = o.top_p or 1.0
    if o.seed then
        s.seed = o.seed
    else
        s.seed = math.random(1, 2 ^ 31)
    end
    return p
end


-- Longest stop string found in text -> its start, or nil.
local function find_stop(text, stops, from)
    local best
    for i = 1, #stops do
        local a = text:find(stops[i], from, true)
        if a and (not best or a < best) then
            best = a
        end
    end
    return best
end


-- ---- generation -----------------------------------------------------------------------------

-- Runs one request to its end. r: { id, stream, chat, stop, ... }.
-- Writes SSE chunks when streaming; fills r.text, r.finish, r.n_completion.
local function run(r)
    local id = r.id
    local sema = engine:semaphore(id)
    local pending = ""     -- bytes not yet complete UTF-8
    local text = {}        -- emitted (non-stream: all) text pieces
    local held = ""        -- streamed text held back while a stop string may be forming
    local hold = 0
    if r.stop then
        for i = 1, #r.stop do
            hold = math.max(hold, #r.stop[i] - 1)
        end
    end
    local n_tok, last, first = 0, nil, true
    local all = ""
    local deadline = r.t0 + (cfg.request_timeout or 600)
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
                metrics.ttft(now - r.t0)
            else
                local d = (now - last) / n
                for _ = 1, n do
                    metrics.itl(d)
                end
            end
            last = now
            local parts = {}
            for i = 0, n - 1 do
                parts[#parts + 1] = model:piece(tok_buf[i])
            end
            n_tok = n_tok + n
            pending = pending .. concat(parts)
            local k = C.tl_utf8_complete_prefix(pending, #pending)
            local out = pending:sub(1, k)
            pending = pending:sub(k + 1)
            if r.stop then
                local before = #all
                all = all .. out
                local at = find_stop(all, r.stop, math.max(1, before - hold))
                if at then
                    out = all:sub(before + 1, at - 1)
                    if at - 1 < before then
                        -- the stop began inside held-back text
                        held = held:sub(1, #held - (before - (at - 1)))
                        out = ""
                    end
                    r.stopped = true
                end
            end
            if r.stream then
                local emit = held .. out
                if not r.stopped and hold > 0 then
                    held = emit:sub(math.max(1, #emit - hold + 1))
                    emit = emit:sub(1, #emit - #held)
                else
                    held = ""
                end
                if emit ~= "" then
                    ngx_print(oa.chunk(r, r.chat, emit, nil, first))
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
        if ngx_now() > deadline then
            engine:cancel(id)
            r.error = "request timed out"
            break
        end
        sema:wait(1)
    end
    if r.stream and held ~= "" then
        ngx_print(oa.chunk(r, r.chat, held, nil, first))
        first = false
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
    local o, verr, field = (chat and oa.chat_request or oa.completion_request)(body)
    if not o then
        return fail(endpoint, 400, verr, field, field and "invalid_value")
    end
    if tenant.system and chat and o.messages[1].role ~= "system" then
        table.insert(o.messages, 1, { role = "system", content = tenant.system })
        pin_system_prompt(tenant)
    end
    local ids, terr2, tfield = tokenize(o)
    if not ids then
        return fail(endpoint, 400, terr2, tfield, "invalid_value")
    end
    local n = #ids
    local msl = model.max_seq_len
    if o.max_tokens_default then
        o.max_tokens = math.max(1, min(tenant.max_tokens or cfg.max_tokens_cap, cfg.max_tokens_cap, msl - n))
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
    local arr = ffi_new("int32_t[?]", n)
    for i = 1, n do
        arr[i - 1] = ids[i]
    end
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
        model = cfg.model_name, n_prompt = n, n_cached = 0, usage_in_stream = true,
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
    if r.error and not (o.stream and r.first_sent) then
        return fail(endpoint, 500, "generation failed: " .. r.error, nil, "engine_error")
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
