# codebox's session driver for R: one R whose global environment lasts across the cells of a
# session. The protocol (docs/sandbox-init.md, "The driver protocol"):
#
#   fd 3  <- cell <execution number> <code length>\n<code>
#   fd 4  -> ready\n                                   (once, at start)
#            syntax <length>\n<message>                (the cell does not parse; nothing ran)
#            compiled\n [result <length>\n<text>] done ok|error|interrupted\n
#
# A cell is parsed whole, then its top-level expressions are evaluated one by one in the
# global environment, as R's console does: each visible value is printed to stdout as the
# console prints it, except the last expression's, whose printed form (with its `[1]`) is the
# result; the first error stops the cell ("Error in f() : ..." on stderr). Warnings are
# printed after the expression that raised them, as the console does with options(warn = 0).
# SIGINT interrupts a cell and is ignored between cells. quit() ends the driver (codebox-init
# reports driver_exited and starts a new one); closeAllConnections() in a cell closes this
# driver's fds 3 and 4 too, and so ends it.
#
# Everything of the driver lives in this function's environment, none in the global one.
local({
  requests <- file("/dev/fd/3", "rb", raw = TRUE)
  replies <- file("/dev/fd/4", "wb", raw = TRUE)
  cell_stdin <- NULL # the connection that holds fd 0 during a cell
  warnings_seen <- list()

  reply <- function(...) {
    writeBin(unlist(lapply(list(...), function(x) if (is.raw(x)) x else charToRaw(x))), replies)
    flush(replies)
  }
  reply_text <- function(word, text) {
    data <- charToRaw(text)
    reply(sprintf("%s %d\n", word, length(data)), data)
  }
  fail <- function(why) {
    cat("codebox r driver: ", why, "\n", sep = "", file = stderr())
    quit(save = "no", status = 70)
  }

  # The next request: list(number, code as raw), or NULL when codebox-init closed fd 3.
  next_request <- function() {
    header <- raw(0)
    repeat {
      byte <- readBin(requests, "raw", 1L)
      if (length(byte) == 0L) return(NULL)
      if (byte == as.raw(10L)) break
      header <- c(header, byte)
      if (length(header) > 64L) fail("a request header longer than 64 bytes")
    }
    fields <- regmatches(rawToChar(header), regexec("^cell ([0-9]+) ([0-9]+)$", rawToChar(header)))[[1]]
    if (length(fields) != 3L) fail(paste("a request that is not `cell <n> <length>`:", rawToChar(header)))
    length <- as.numeric(fields[3])
    code <- raw(0)
    while (length(code) < length) {
      part <- readBin(requests, "raw", length - length(code))
      if (length(part) == 0L) fail("the requests ended inside a cell")
      code <- c(code, part)
    }
    list(number = fields[2], code = code)
  }

  # fd 0 on `path` (the cell's stdin) or /dev/null. R cannot dup2: fd 0 is closed, and the
  # next file opened takes the lowest free descriptor, 0. file("stdin") dups it.
  set_stdin <- function(path) {
    if (!is.null(cell_stdin)) close(cell_stdin)
    cell_stdin <<- NULL
    parallel:::closeFD(0L)
    cell_stdin <<- tryCatch(file(path, "rb"), error = function(e) file("/dev/null", "rb"))
  }

  # As R prints an error or a warning: "<prefix> f() : msg", the message on a line of its own
  # when the whole would pass 75 columns (errors.c's LONGWARN), or "<bare>msg" without a call
  # (the call that evaluates a cell's expression is this driver's, not shown).
  with_call <- function(condition, prefix, bare = "") {
    call <- conditionCall(condition)
    message <- conditionMessage(condition)
    if (is.null(call) || identical(call, quote(eval(expr, globalenv())))) {
      return(paste0(bare, message))
    }
    call <- deparse(call, nlines = 1L)
    first <- strsplit(message, "\n")[[1L]][1L]
    long <- 14L + nchar(call, type = "w") + nchar(first, type = "w") > 75L
    paste0(prefix, " ", call, " :", if (isTRUE(long)) "\n  " else " ", message)
  }
  print_warnings <- function() {
    if (length(warnings_seen) == 0L) return()
    texts <- vapply(warnings_seen, with_call, "", prefix = "In")
    warnings_seen <<- list()
    if (length(texts) == 1L) {
      cat("Warning message:\n", texts, "\n", sep = "", file = stderr())
    } else {
      cat("Warning messages:\n", paste0(seq_along(texts), ": ", texts, "\n"), sep = "", file = stderr())
    }
  }

  # One top-level expression, as the console evaluates it: its value and whether it is visible.
  evaluate <- function(expr) {
    withCallingHandlers(withVisible(eval(expr, globalenv())), warning = function(w) {
      level <- getOption("warn", 0L)
      if (level == 0L) warnings_seen[[length(warnings_seen) + 1L]] <<- w
      if (level == 1L) cat(with_call(w, "Warning in", "Warning: "), "\n", sep = "", file = stderr())
      if (level < 2L) invokeRestart("muffleWarning") # 2 and over: R makes it an error
    })
  }

  # Runs the parsed cell: list(status, result text or NULL).
  execute <- function(exprs) {
    result <- NULL
    for (i in seq_along(exprs)) {
      outcome <- tryCatch({
        value <- evaluate(exprs[[i]])
        if (value$visible && i == length(exprs)) {
          result <- paste(utils::capture.output(print(value$value)), collapse = "\n")
        } else if (value$visible) {
          print(value$value)
        }
        NULL
      }, error = function(e) {
        cat(with_call(e, "Error in", "Error: "), "\n", sep = "", file = stderr())
        "error"
      })
      print_warnings()
      if (!is.null(outcome)) return(list(status = outcome, result = NULL))
    }
    list(status = "ok", result = result)
  }

  # Answers one request: syntax, or compiled ... done.
  cell <- function(number, code) {
    filename <- sprintf("<cell %s>", number)
    exprs <- suspendInterrupts(tryCatch({
      text <- rawToChar(code)
      parse(text = text, srcfile = srcfilecopy(filename, text))
    }, error = function(e) e))
    if (inherits(exprs, "error")) {
      return(reply_text("syntax", paste0("Error: ", conditionMessage(exprs), "\n")))
    }
    tryCatch(Sys.sleep(0), interrupt = function(e) NULL) # a SIGINT that came before: ignored
    reply("compiled\n")
    outcome <- tryCatch({
      set_stdin(Sys.getenv("CODEBOX_CELL_STDIN"))
      execute(exprs)
    }, interrupt = function(e) {
      warnings_seen <<- list()
      list(status = "interrupted", result = NULL)
    })
    suspendInterrupts({
      set_stdin("/dev/null")
      flush(stdout())
      flush(stderr())
      if (!is.null(outcome$result)) reply_text("result", outcome$result)
      reply(sprintf("done %s\n", outcome$status))
    })
  }

  main <- function() {
    reply("ready\n") # fd 0 is /dev/null already
    repeat {
      request <- NULL
      # A SIGINT while waiting stays pending, then is taken here and ignored.
      tryCatch({
        suspendInterrupts(request <- next_request())
        Sys.sleep(0)
      }, interrupt = function(e) NULL)
      if (is.null(request)) quit(save = "no", status = 0)
      cell(request$number, request$code)
    }
  }
  main()
})
