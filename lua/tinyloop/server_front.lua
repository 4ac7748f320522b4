-- tinyloop.server_front - the front tier: a plain nginx (no engine) routing
-- across engine instances (examples/nginx-front.conf).
--
--   init_worker_by_lua_block { require("tinyloop.server_front").init{ backends = "a=127.0.0.1:8081,..." } }
--   access_by_lua_block   { require("tinyloop.server_front").route() }     -- decides (may yield)
--   balancer_by_lua_block { require("tinyloop.server_front").balance() }   -- applies, retries
--   log_by_lua_block      { require("tinyloop.server_front").done() }
--
-- The decision is prefix-aware: a request's affinity key (its tenant's API
-- key, else a hash of the start of its body) remembers the instance that
-- served it last (set when the balancer picks it), which holds that prefix in its cache; a request goes
-- there unless that instance is much busier than the least loaded one, or
-- marked down. The rest are ordered by load, then by a stable hash of the
-- key. The balancer phase cannot yield, so it only walks that order: each
-- retry (proxy_next_upstream) marks the failed instance down for a while
-- and takes the next. State lives in a lua_shared_dict shared by all front
-- workers: owners by key, in-flight counts and down marks.
-- luacheck: globals ngx
local balancer = require "ngx.balancer"

local ngx_var, ngx_ctx = ngx.var, ngx.ctx
local format, tonumber, sort = string.format, tonumber, table.sort

local _M = {}

local backends = {}        -- { name, host, port }
local by_name = {}
local DICT = "tinyloop_front"
local DOWN_FOR = 10        -- seconds an instance that failed is skipped
local IMBALANCE = 16       -- owner this many requests busier than the least loaded: rebalance
local router = nil         -- fn(request, candidates) -> candidate: the routing policy


local policy_rt = nil      -- the routing policy runtime (tinyloop.policy), when configured


local function policy_tick(premature)
    if premature or not policy_rt then
        return
    end
    local dict = ngx.shared[DICT]
    if ngx.worker.id() == 0 and policy_rt:maybe_reload() then
        policy_rt:publish(dict, "front")
    end
    policy_rt:sync(dict, "front")
end


-- The routing policy (lua/policies/routing.lua shape) decides the first
-- instance; it hot-reloads like the engine's tenants policy: worker 0
-- watches the file and publishes through the shared dict, every worker syncs.
local function start_policy(path)
    local ok, policy = pcall(require, "tinyloop.policy")
    if not ok then
        return nil, policy
    end
    local rok, rt = pcall(policy.Runtime, { path = path, kind = "routing", interval_ms = 500, name = "routing",
        log = function(msg, level)
            ngx.log(level == "warn" and ngx.WARN or ngx.NOTICE, msg)
        end })
    if not rok then
        return nil, rt
    end
    policy_rt = rt
    rt:sync(ngx.shared[DICT], "front")
    ngx.timer.every(0.5, policy_tick)
    local pseudo = {}   -- stand-in token arrays: the front does not tokenize
    router = function(req, cands)
        local n = math.min(math.max(1, math.floor(req.len / 4)), 4096)
        local toks = pseudo[n]
        if not toks then
            toks = {}
            for i = 1, n do
                toks[i] = 0
            end
            pseudo[n] = toks
        end
        local up = {}
        for _, c in ipairs(cands) do
            if not c.down then
                up[#up + 1] = { id = c.id, load = c.load, queued = 0, match = c.match > 0 and n or 0, c = c }
            end
        end
        if #up == 0 then
            return nil
        end
        local v = rt:acquire()
        local got = policy.route(v, { tokens = toks, tenant = req.key }, up)
        rt:release(v)
        return got and got.c
    end
    return true
end


-- init{ backends = "name=host:port,..." | { { name, host, port } }, dict, down_for,
-- routing_policy = path ($TINYLOOP_ROUTING_POLICY) }.
function _M.init(opts)
    opts = opts or {}
    local b = opts.backends or os.getenv("TINYLOOP_BACKENDS") or ""
    backends, by_name = {}, {}
    if type(b) == "string" then
        for item in b:gmatch("[^,%s]+") do
            local name, host, port = item:match("^([^=]+)=([^:]+):(%d+)$")
            if not name then
                host, port = item:match("^([^:]+):(%d+)$")
                name = item
            end
            if host then
                backends[#backends + 1] = { name = name, host = host, port = tonumber(port) }
            else
                ngx.log(ngx.ERR, "tinyloop front: bad backend ", item)
            end
        end
    else
        backends = b
    end
    for _, be in ipairs(backends) do
        by_name[be.name] = be
    end
    DICT = opts.dict or DICT
    DOWN_FOR = opts.down_for or DOWN_FOR
    local path = opts.routing_policy or os.getenv("TINYLOOP_ROUTING_POLICY")
    if path and path ~= "" then
        local ok, err = start_policy(path)
        if not ok then
            ngx.log(ngx.ERR, "tinyloop front: routing policy ", path, ": ", tostring(err),
                "; routing by the built-in rule")
        end
    end
end


function _M.set_router(fn)
    router = fn
end


local function hash(s)
    return ngx.crc32_long(s or "")
end


-- affinity_key() -> key, body length (a stand-in for the prompt's length).
local function affinity_key()
    ngx.req.read_body()
    local body = ngx.req.get_body_data() or ""
    local auth = ngx_var.http_authorization
    local key = auth and auth:match("^%s*[Bb]earer%s+(%S+)")
    if key then
        return "k:" .. key, #body
    end
    -- the prompt's start: a cheap stand-in for its longest cached prefix
    local p = body:match('"content"%s*:%s*"(.-[^\\])"') or body:match('"prompt"%s*:%s*"(.-[^\\])"') or body
    return "p:" .. ngx.md5(p:sub(1, 256)), #body
end


-- access phase: computes ngx.ctx.tl_order (instance names, best first).
function _M.route()
    local dict = ngx.shared[DICT]
    local key, len = affinity_key()
    local owner = dict:get("owner:" .. key)
    local cands = {}
    local lo = math.huge
    for _, be in ipairs(backends) do
        local c = {
            id = be.name, load = dict:get("load:" .. be.name) or 0,
            down = dict:get("down:" .. be.name) ~= nil,
            match = be.name == owner and 1 or 0, h = hash(key .. be.name),
        }
        cands[#cands + 1] = c
        if not c.down and c.load < lo then
            lo = c.load
        end
    end
    local first
    if router then
        first = router({ key = key, len = len }, cands)
    end
    sort(cands, function(a, b)
        if a.down ~= b.down then
            return b.down
        end
        local ao = a.match > 0 and a.load - lo <= IMBALANCE
        local bo = b.match > 0 and b.load - lo <= IMBALANCE
        if ao ~= bo then
            return ao
        end
        if a.load ~= b.load then
            return a.load < b.load
        end
        return a.h < b.h
    end)
    local order = {}
    if first and not first.down then
        order[1] = first.id
    end
    for _, c in ipairs(cands) do
        if c.id ~= order[1] then
            order[#order + 1] = c.id
        end
    end
    ngx_ctx.tl_order, ngx_ctx.tl_key, ngx_ctx.tl_try = order, key, 0
    if #order == 0 then
        ngx.status = 503
        ngx.header["Content-Type"] = "application/json"
        ngx.header["Retry-After"] = 1
        ngx.say('{"error":{"message":"no engine instances configured","type":"server_error",'
            .. '"param":null,"code":"no_backends"}}')
        return ngx.exit(503)
    end
end


-- balancer phase: the next instance in the order; marks a failed one down.
function _M.balance()
    local ctx = ngx_ctx
    local dict = ngx.shared[DICT]
    local order = ctx.tl_order
    local try = ctx.tl_try + 1
    ctx.tl_try = try
    if try > 1 and ctx.tl_cur then
        dict:set("down:" .. ctx.tl_cur, true, DOWN_FOR)
        dict:incr("load:" .. ctx.tl_cur, -1, 0)
        dict:incr("failovers", 1, 0)
    else
        balancer.set_more_tries(#order - 1)
    end
    local be = by_name[order[try]]
    if not be then
        return ngx.exit(502)
    end
    local ok, err = balancer.set_current_peer(be.host, be.port)
    if not ok then
        ngx.log(ngx.ERR, "tinyloop front: set_current_peer ", be.name, ": ", err)
        return ngx.exit(500)
    end
    ctx.tl_cur = be.name
    dict:incr("load:" .. be.name, 1, 0)
    -- the instance serving this request will hold its prefix: the key's next
    -- requests follow at once (the log phase may run after the client has
    -- its answer and sent the next request)
    dict:set("owner:" .. ctx.tl_key, be.name)
end


-- log phase: the request no longer loads its instance.
function _M.done()
    local cur = ngx_ctx.tl_cur
    if cur then
        ngx.shared[DICT]:incr("load:" .. cur, -1, 0)
    end
end


-- GET /front/status: the instances and what the front knows of them.
function _M.status()
    local dict = ngx.shared[DICT]
    local out = {}
    for _, be in ipairs(backends) do
        out[#out + 1] = format('{"name":"%s","addr":"%s:%d","load":%d,"down":%s}', be.name, be.host,
            be.port, dict:get("load:" .. be.name) or 0, dict:get("down:" .. be.name) and "true" or "false")
    end
    ngx.header["Content-Type"] = "application/json"
    ngx.say(format('{"instances":[%s],"failovers":%d,"policy":%s}', table.concat(out, ","),
        dict:get("failovers") or 0, policy_rt and policy_rt.current and format("%q", policy_rt.current.version)
        or "null"))
end


return _M
