# fxa_library(NAME SOURCES src... [PUBLIC_DEPS dep...] [PRIVATE_INCLUDES dir...]
#             [PC_REQUIRES module...] [PC_LIBS flag...])
#
# One fxattn library from its sources: an OBJECT library NAME_obj (where
# per-file flags and extra sources go), built into libNAME.a (target
# NAME_static) and libNAME.so (NAME_shared, soversion 0), with alias targets
# fxattn::NAME (shared) and fxattn::NAME_static, the names an installed
# prefix exports (find_package(fxattn CONFIG)). Symbols are hidden unless
# marked FXA_API; PUBLIC_DEPS are the other fxattn libraries (by short name,
# e.g. fxattn) and the outside libraries it links.
function(fxa_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;PUBLIC_DEPS;PRIVATE_INCLUDES;PC_REQUIRES;PC_LIBS" ${ARGN})
  add_library(${name}_obj OBJECT ${ARG_SOURCES})
  target_include_directories(${name}_obj PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include> $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/include>)
  target_include_directories(${name}_obj PRIVATE ${PROJECT_SOURCE_DIR}/src ${ARG_PRIVATE_INCLUDES})
  target_compile_options(${name}_obj PRIVATE ${FXA_WARNINGS} -fvisibility=hidden)
  # _GNU_SOURCE for sysconf, pread and pthread details under -std=c11.
  target_compile_definitions(${name}_obj PRIVATE _GNU_SOURCE)
  add_library(${name}_static STATIC $<TARGET_OBJECTS:${name}_obj>)
  add_library(${name}_shared SHARED $<TARGET_OBJECTS:${name}_obj>)
  # RUNPATH $ORIGIN: an installed prefix (or the Python wheel) finds its own
  # fxattn libraries wherever it is moved.
  set_target_properties(${name}_shared PROPERTIES VERSION ${PROJECT_VERSION} SOVERSION 0
                        INSTALL_RPATH "$ORIGIN")
  foreach(kind static shared)
    set(t ${name}_${kind})
    set_target_properties(${t} PROPERTIES OUTPUT_NAME ${name})
    target_include_directories(${t} PUBLIC
      $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include> $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/include>
      $<INSTALL_INTERFACE:include>)
    foreach(dep ${ARG_PUBLIC_DEPS})
      if(TARGET ${dep}_${kind})
        target_link_libraries(${t} PUBLIC ${dep}_${kind})
      else()
        target_link_libraries(${t} PUBLIC ${dep})
      endif()
    endforeach()
  endforeach()
  # The object library compiles against outside targets' headers (MPI's).
  foreach(dep ${ARG_PUBLIC_DEPS})
    if(TARGET ${dep} AND NOT TARGET ${dep}_static)
      target_link_libraries(${name}_obj PUBLIC ${dep})
    endif()
  endforeach()
  set_target_properties(${name}_shared PROPERTIES EXPORT_NAME ${name})
  set_target_properties(${name}_static PROPERTIES EXPORT_NAME ${name}_static)
  install(TARGETS ${name}_static ${name}_shared EXPORT fxattnTargets)
  add_library(fxattn::${name} ALIAS ${name}_shared)
  add_library(fxattn::${name}_static ALIAS ${name}_static)
  # pkg-config: NAME.pc requires the other fxattn libraries' files
  # (PC_REQUIRES) and links the outside ones (PC_LIBS).
  set(FXA_PC_NAME ${name})
  # prefix relative to the .pc file, so that an installed tree can move.
  file(RELATIVE_PATH FXA_PC_UP /p/${CMAKE_INSTALL_LIBDIR}/pkgconfig /p)
  string(REPLACE ";" " " FXA_PC_REQUIRES "${ARG_PC_REQUIRES}")
  string(REPLACE ";" " " FXA_PC_LIBS "${ARG_PC_LIBS}")
  configure_file(${PROJECT_SOURCE_DIR}/cmake/fxattn.pc.in ${PROJECT_BINARY_DIR}/pkgconfig/${name}.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/pkgconfig/${name}.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endfunction()
